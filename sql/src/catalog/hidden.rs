//! The hidden key of a table declared without a primary key: its `auto_incrementing_id` is a
//! column like any other to DataFusion (UPDATE and DELETE find rows by it, a query may name
//! it), but `SELECT *` and `t.*` leave it out, as Kudu and Impala do. Statements are rewritten
//! before DataFusion plans them: a wildcard over such a table gets `EXCLUDE
//! (auto_incrementing_id)`; an unqualified one over several such tables becomes one qualified
//! wildcard per table of the FROM clause, each excluding it where the table has it.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    ExcludeSelectItem, Ident, ObjectName, Query, Select, SelectItem,
    SelectItemQualifiedWildcardKind, SetExpr, TableFactor, VisitMut, VisitorMut,
    WildcardAdditionalOptions,
};
use nyala_engine::Client;
use nyala_storage::AUTO_INCREMENT_COLUMN;

use crate::parse::statement::{normalize_ident, object_name};

/// Leaves the hidden key of the tables `keyless` says are declared without a primary key out
/// of `statement`'s wildcards.
pub(crate) fn exclude_hidden<V: VisitMut>(statement: &mut V, keyless: impl Fn(&str) -> bool) {
    let _ = statement.visit(&mut Hide { keyless });
}

/// Whether a table of `client`'s catalog is declared without a primary key, by name.
pub(crate) fn keyless_in(client: &Client) -> impl Fn(&str) -> bool + '_ {
    |name| client.table(name).is_ok_and(|t| t.schema.is_keyless())
}

struct Hide<F> {
    keyless: F,
}

impl<F: Fn(&str) -> bool> VisitorMut for Hide<F> {
    type Break = ();

    fn post_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        hide_in(&mut query.body, &self.keyless);
        ControlFlow::Continue(())
    }
}

fn hide_in(body: &mut SetExpr, keyless: &impl Fn(&str) -> bool) {
    match body {
        SetExpr::Select(select) => hide_in_select(select, keyless),
        SetExpr::SetOperation { left, right, .. } => {
            hide_in(left, keyless);
            hide_in(right, keyless);
        }
        _ => {}
    }
}

fn hide_in_select(select: &mut Select, keyless: &impl Fn(&str) -> bool) {
    // The relations of the FROM clause: how the query names each, and whether it hides a key.
    let mut relations: Vec<(Ident, bool)> = Vec::new();
    for table in &select.from {
        for factor in
            std::iter::once(&table.relation).chain(table.joins.iter().map(|j| &j.relation))
        {
            let named = match factor {
                TableFactor::Table {
                    name,
                    alias,
                    args: None,
                    ..
                } => {
                    let hides = object_name(name).is_ok_and(|n| keyless(&n));
                    let qualifier = match alias {
                        Some(alias) => Some(alias.name.clone()),
                        None => name.0.last().and_then(|p| p.as_ident()).cloned(),
                    };
                    qualifier.map(|q| (q, hides))
                }
                TableFactor::Table { alias, .. }
                | TableFactor::Derived { alias, .. }
                | TableFactor::Function { alias, .. }
                | TableFactor::UNNEST { alias, .. } => {
                    alias.as_ref().map(|a| (a.name.clone(), false))
                }
                _ => None,
            };
            match named {
                Some(named) => relations.push(named),
                // A relation this does not know how to name: wildcards stay as they are.
                None => return,
            }
        }
    }
    let hiding = relations.iter().filter(|(_, hides)| *hides).count();
    if hiding == 0 {
        return;
    }
    let projection = std::mem::take(&mut select.projection);
    for item in projection {
        match item {
            SelectItem::Wildcard(mut options) if hiding == 1 => {
                exclude(&mut options);
                select.projection.push(SelectItem::Wildcard(options));
            }
            SelectItem::Wildcard(options) if plain(&options) => {
                for (qualifier, hides) in &relations {
                    let mut options = options.clone();
                    if *hides {
                        exclude(&mut options);
                    }
                    select.projection.push(SelectItem::QualifiedWildcard(
                        SelectItemQualifiedWildcardKind::ObjectName(ObjectName::from(vec![
                            qualifier.clone(),
                        ])),
                        options,
                    ));
                }
            }
            SelectItem::QualifiedWildcard(
                SelectItemQualifiedWildcardKind::ObjectName(name),
                mut options,
            ) => {
                let qualifier = name
                    .0
                    .last()
                    .and_then(|p| p.as_ident())
                    .map(normalize_ident);
                let hides = relations
                    .iter()
                    .any(|(q, hides)| *hides && Some(normalize_ident(q)) == qualifier);
                if hides {
                    exclude(&mut options);
                }
                select.projection.push(SelectItem::QualifiedWildcard(
                    SelectItemQualifiedWildcardKind::ObjectName(name),
                    options,
                ));
            }
            other => select.projection.push(other),
        }
    }
}

/// A wildcard without EXCLUDE, EXCEPT, REPLACE or RENAME (one that can be split by table).
fn plain(options: &WildcardAdditionalOptions) -> bool {
    options.opt_exclude.is_none()
        && options.opt_except.is_none()
        && options.opt_replace.is_none()
        && options.opt_rename.is_none()
        && options.opt_ilike.is_none()
}

/// Adds the hidden key to a wildcard's EXCLUDE list.
fn exclude(options: &mut WildcardAdditionalOptions) {
    let hidden = ObjectName::from(vec![Ident::new(AUTO_INCREMENT_COLUMN)]);
    let is_hidden = |name: &ObjectName| name.to_string() == AUTO_INCREMENT_COLUMN;
    options.opt_exclude = Some(match options.opt_exclude.take() {
        None => ExcludeSelectItem::Single(hidden),
        Some(ExcludeSelectItem::Single(name)) if is_hidden(&name) => {
            ExcludeSelectItem::Single(name)
        }
        Some(ExcludeSelectItem::Single(name)) => ExcludeSelectItem::Multiple(vec![name, hidden]),
        Some(ExcludeSelectItem::Multiple(mut names)) => {
            if !names.iter().any(is_hidden) {
                names.push(hidden);
            }
            ExcludeSelectItem::Multiple(names)
        }
    });
}
