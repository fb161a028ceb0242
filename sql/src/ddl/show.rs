//! SHOW and DESCRIBE: statements answered from the catalog and the session's settings when they
//! are planned, as small string tables.
//!
//! They run no plan, so their rows are computed once, at planning, and a client reads them
//! like any query's (Flight SQL fetches them with the same tickets).

use arrow::array::RecordBatch;
use nyala_storage::{ColumnCompression, ColumnEncoding, ColumnType};

use crate::catalog::schema::visible;
use crate::catalog::sys::partitions;
use crate::parse::partitioning;
use crate::parse::statement::Show;
use crate::results::string_batch;
use crate::session::Session;
use crate::{Result, SqlError};

impl Session {
    /// The rows that answer `show`.
    pub(crate) fn show(&self, show: &Show) -> Result<RecordBatch> {
        match show {
            Show::Tables => {
                // Tables, then views (information_schema.tables tells them apart).
                let client = &self.db.client;
                let tables = client.tables().into_iter().map(|t| t.name.clone());
                let views = client.views().into_iter().map(|v| v.name.clone());
                let names = visible(client, &self.principal, tables.chain(views));
                string_batch(vec![("table_name", names)])
            }
            Show::Grants => self.show_grants(),
            Show::Describe(name) => self.describe(name),
            Show::CreateTable(name) => self.show_create(name),
            Show::Partitions(name) => self.show_partitions(name),
            Show::Setting(name) => self.show_setting(name),
        }
    }

    /// `SHOW GRANTS`: one row per object, user and privilege, with the object's owner (who
    /// holds every privilege: privilege OWNER),
    /// of the objects the session's user owns and the privileges granted to it; the
    /// administrator sees all.
    fn show_grants(&self) -> Result<RecordBatch> {
        let client = &self.db.client;
        let user = self.user();
        let admin = crate::session::access::Authorizer { client }.is_admin(user.as_deref());
        let objects = (client.tables().into_iter())
            .map(|t| (t.name.clone(), "TABLE", t.access.clone()))
            .chain(
                (client.views().into_iter()).map(|v| (v.name.clone(), "VIEW", v.access.clone())),
            );
        let mut rows: Vec<[String; 5]> = Vec::new();
        for (name, kind, access) in objects {
            let owns = admin || access.owner.is_some() && access.owner == user;
            if let Some(owner) = &access.owner {
                if owns {
                    rows.push([
                        name.clone(),
                        kind.into(),
                        owner.clone(),
                        "OWNER".into(),
                        String::new(),
                    ]);
                }
            }
            for (grantee, privileges) in &access.grants {
                if owns || Some(grantee) == user.as_ref() {
                    for privilege in privileges {
                        rows.push([
                            name.clone(),
                            kind.into(),
                            grantee.clone(),
                            privilege.name().into(),
                            access.owner.clone().unwrap_or_default(),
                        ]);
                    }
                }
            }
        }
        let column = |i: usize| rows.iter().map(|r| r[i].clone()).collect::<Vec<_>>();
        string_batch(vec![
            ("object", column(0)),
            ("object_type", column(1)),
            ("user", column(2)),
            ("privilege", column(3)),
            ("owner", column(4)),
        ])
    }

    /// `DESCRIBE t`: one row per column.
    fn describe(&self, name: &str) -> Result<RecordBatch> {
        let table = self.db.client.table(name)?;
        let columns = table.schema.columns();
        let yes_no = |b: bool| if b { "YES" } else { "NO" }.to_string();
        string_batch(vec![
            (
                "column_name",
                columns.iter().map(|c| c.name.clone()).collect(),
            ),
            (
                "data_type",
                columns
                    .iter()
                    .map(|c| c.column_type.sql_name().to_string())
                    .collect(),
            ),
            (
                "nullable",
                columns.iter().map(|c| yes_no(c.nullable)).collect(),
            ),
            (
                "primary_key",
                (0..columns.len())
                    .map(|i| yes_no(table.schema.is_key_column(i)))
                    .collect(),
            ),
            (
                "default",
                columns
                    .iter()
                    .map(|c| c.default.clone().unwrap_or_default())
                    .collect(),
            ),
            (
                "comment",
                columns
                    .iter()
                    .map(|c| c.comment.clone().unwrap_or_default())
                    .collect(),
            ),
            (
                "encoding",
                columns.iter().map(|c| c.encoding.name().into()).collect(),
            ),
            (
                "compression",
                columns
                    .iter()
                    .map(|c| c.compression.name().into())
                    .collect(),
            ),
        ])
    }

    /// `SHOW PARTITIONS`: the table's rows of `sys.partitions`, without the table name.
    fn show_partitions(&self, name: &str) -> Result<RecordBatch> {
        let table = self.db.client.table(name)?;
        let batch = partitions(&self.db.client, &[table])?;
        let columns: Vec<usize> = (1..batch.num_columns()).collect();
        Ok(batch.project(&columns)?)
    }

    /// `SHOW CREATE TABLE`: a CREATE TABLE statement that recreates the table's schema and
    /// partitioning.
    fn show_create(&self, name: &str) -> Result<RecordBatch> {
        let table = self.db.client.table(name)?;
        let schema = &table.schema;
        let names = |columns: &[usize]| schema.column_list(columns);
        let mut lines: Vec<String> = schema
            .columns()
            .iter()
            .enumerate()
            .filter(|(i, _)| schema.auto_increment_column() != Some(*i))
            .map(|(i, c)| {
                let null = if schema.is_key_column(i) {
                    ""
                } else if c.nullable {
                    " NULL"
                } else {
                    " NOT NULL"
                };
                let quote = |t: &str| format!("'{}'", t.replace('\'', "''"));
                let default = match (&c.default, &c.column_type) {
                    (None, _) => String::new(),
                    (Some(v), ColumnType::Bool) => format!(" DEFAULT {v}"),
                    (Some(v), t) if t.arrow_type().is_numeric() => format!(" DEFAULT {v}"),
                    (Some(v), _) => format!(" DEFAULT {}", quote(v)),
                };
                let comment = c
                    .comment
                    .as_ref()
                    .map_or(String::new(), |t| format!(" COMMENT {}", quote(t)));
                let mut storage = String::new();
                if schema.position_column() == Some(i) {
                    storage.push_str(" GENERATED ALWAYS AS POSITION");
                }
                if c.encoding != ColumnEncoding::Auto {
                    storage.push_str(&format!(" ENCODING {}", c.encoding.name()));
                }
                if c.compression != ColumnCompression::Default {
                    storage.push_str(&format!(" COMPRESSION {}", c.compression.name()));
                }
                format!(
                    "  {} {}{null}{default}{comment}{storage}",
                    c.name,
                    c.column_type.sql_name()
                )
            })
            .collect();
        let unique = match schema.auto_increment_column() {
            Some(_) => "NON UNIQUE ",
            None => "",
        };
        // A table without a primary key is keyed by its hidden auto_incrementing_id alone.
        if !schema.is_keyless() {
            lines.push(format!(
                "  {unique}PRIMARY KEY ({})",
                names(schema.declared_key_columns())
            ));
        }
        let mut sql = format!("CREATE TABLE {} (\n{}\n)", table.name, lines.join(",\n"));
        if let Some(clause) = partitioning::render(schema, &table.partition) {
            sql.push(' ');
            sql.push_str(&clause);
        }
        let mut options = Vec::new();
        if table.replicas > 0 {
            options.push(format!("replicas = {}", table.replicas));
        }
        if let Some(secs) = schema.history_max_age_secs() {
            options.push(format!("history_max_age_secs = {secs}"));
        }
        if !options.is_empty() {
            sql.push_str(&format!(" WITH ({})", options.join(", ")));
        }
        string_batch(vec![
            ("table_name", vec![table.name.clone()]),
            ("create_statement", vec![sql]),
        ])
    }

    /// `SHOW nyala.<setting>`, answered as DataFusion answers SHOW: columns `name` and `value`.
    fn show_setting(&self, name: &str) -> Result<RecordBatch> {
        let value = self
            .settings()
            .into_iter()
            .find(|(known, _)| known == name)
            .ok_or_else(|| SqlError::Invalid(format!("unknown setting '{name}'")))?
            .1
            .unwrap_or_default();
        string_batch(vec![
            ("name", vec![name.to_string()]),
            ("value", vec![value]),
        ])
    }
}
