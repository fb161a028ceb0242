//! What PostgreSQL clients read about the database: `pg_catalog` in every PostgreSQL session
//! (`datafusion-pg-catalog`'s, with Nyala's tables and their keys in it: [`tables`]), the
//! functions clients call on it, and the statements they send to read it, rewritten into
//! SQL the engine plans ([`rewrite`]).

mod booleans;
mod functions;
mod relations;
mod rewrite;
mod tables;

use std::sync::Arc;

use datafusion_pg_catalog::pg_catalog::context::EmptyContextProvider;
use nyala_server::ClientSession;

pub(crate) use rewrite::rewritten;

use relations::Relations;
use tables::PgCatalog;

/// Installs `pg_catalog` and the functions clients call on it in `session`'s catalog.
pub(crate) fn install(session: &Arc<ClientSession>) {
    let context = session.sql().context();
    if let Err(e) = datafusion_pg_catalog::setup_pg_catalog(
        context,
        nyala_sql::CATALOG_NAME,
        EmptyContextProvider,
    ) {
        tracing::warn!(error = %e, "pg_catalog is not available in a PostgreSQL session");
        return;
    }
    let relations = Relations::new(session);
    let catalog = context.catalog(nyala_sql::CATALOG_NAME);
    let library = catalog
        .as_ref()
        .and_then(|catalog| catalog.schema("pg_catalog"));
    if let (Some(catalog), Some(library)) = (catalog, library) {
        let relations = relations.clone();
        let pg_catalog = Arc::new(PgCatalog { library, relations });
        if let Err(e) = catalog.register_schema("pg_catalog", pg_catalog) {
            tracing::warn!(error = %e, "pg_catalog does not list Nyala's keys");
        }
    }
    booleans::install(context);
    for udf in functions::all() {
        context.register_udf(udf);
    }
    context.register_udf(relations.constraintdef_udf());
    context.register_udf(relations.indexdef_udf());
}
