//! Opening a session on a [`Database`]: a DataFusion state of its own (settings, transaction
//! slot) with Nyala's catalog (`nyala.public`, `nyala.sys`), its table functions (`tail`,
//! `nyala_as_of`), its optimizer rules (runtime filters, decimal arithmetic, yielding leaves),
//! its physical planner (DML nodes) and bounded functions registered, over the engine client
//! all sessions share.

use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::catalog::{CatalogProvider, MemoryCatalogProvider};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::catalog::schema::{view_plan, NyalaSchemaProvider};
use crate::catalog::sys::SysSchemaProvider;
use crate::database::Database;
use crate::distributed;
use crate::exec::decimal::DecimalArithmeticRule;
use crate::exec::runtime_filter::rule::RuntimeFilterRule;
use crate::functions::as_of::{self, AsOfFunction};
use crate::functions::bounded::bound_growing_functions;
use crate::functions::changes::{self, ChangesFunction};
use crate::functions::tail::{self, TailFunction};
use crate::plan::dml::NyalaQueryPlanner;
use crate::plan::yielding_leaves::YieldingLeaves;
use crate::results::client_schema;
use crate::session::access::Principal;
use crate::session::settings::NyalaOptions;
use crate::session::transaction::TxnSlot;
use crate::session::Session;
use crate::{CATALOG_NAME, SCHEMA_NAME};

impl Database {
    /// A new SQL session over this database.
    pub fn session(self: &Arc<Self>) -> Session {
        let txn = Arc::new(TxnSlot::default());
        let config = SessionConfig::new()
            .with_default_catalog_and_schema(CATALOG_NAME, SCHEMA_NAME)
            .with_create_default_catalog_and_schema(false)
            .with_information_schema(true)
            // Tablets are the unit of scan parallelism: a scan-only plan keeps one partition per
            // tablet, so Flight SQL can hand each tablet to a separate reader.
            .with_round_robin_repartition(false)
            .with_option_extension(NyalaOptions::default())
            .with_extension(txn.clone());
        let mut builder = SessionStateBuilder::new()
            .with_config(config)
            .with_default_features()
            .with_physical_optimizer_rule(Arc::new(RuntimeFilterRule::default()))
            .with_physical_optimizer_rule(Arc::new(DecimalArithmeticRule))
            .with_physical_optimizer_rule(Arc::new(YieldingLeaves))
            .with_query_planner(Arc::new(NyalaQueryPlanner));
        if self.is_cluster() {
            builder = distributed::coordinating(builder, self);
        }
        let mut state = builder.build();
        // JSON: json_get*, json_as_text, json_contains, json_length, ... and `->`, `->>`, `?`.
        // (Registering into a fresh state does not fail.)
        let _ = datafusion_functions_json::register_all(&mut state);
        let ctx = SessionContext::new_with_state(state);
        bound_growing_functions(&ctx);
        let principal = Arc::new(Principal::default());
        let catalog = MemoryCatalogProvider::new();
        // Registering a schema into a fresh in-memory catalog cannot fail.
        let _ = catalog.register_schema(
            SCHEMA_NAME,
            Arc::new(NyalaSchemaProvider::new(
                self.client.clone(),
                ctx.state_weak_ref(),
                principal.clone(),
            )),
        );
        let _ = catalog.register_schema(
            SysSchemaProvider::NAME,
            Arc::new(SysSchemaProvider::new(
                self.client.clone(),
                principal.clone(),
            )),
        );
        ctx.register_catalog(CATALOG_NAME, Arc::new(catalog));
        ctx.register_udtf(
            tail::FUNCTION,
            Arc::new(TailFunction {
                client: self.client.clone(),
            }),
        );
        ctx.register_udtf(
            changes::FUNCTION,
            Arc::new(ChangesFunction {
                client: self.client.clone(),
            }),
        );
        ctx.register_udtf(
            as_of::FUNCTION,
            Arc::new(AsOfFunction {
                client: self.client.clone(),
            }),
        );
        Session {
            db: self.clone(),
            ctx,
            principal,
            txn,
        }
    }

    /// Names and result schemas of all views, sorted by name. A view whose query no longer
    /// plans (a table it reads was dropped) has no columns.
    pub async fn views(self: &Arc<Self>) -> Vec<(String, SchemaRef)> {
        let state = self.session().ctx.state();
        let mut views = Vec::new();
        for view in self.client.views() {
            let schema = match view_plan(&state, &self.client, &view.sql).await {
                Ok(plan) => client_schema(&Arc::new(plan.schema().as_arrow().clone())),
                Err(_) => Arc::new(arrow::datatypes::Schema::empty()),
            };
            views.push((view.name.clone(), schema));
        }
        views
    }
}
