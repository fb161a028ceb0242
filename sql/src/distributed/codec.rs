//! [`NyalaCodec`]: how Nyala's operators travel inside the plan fragments datafusion-distributed
//! sends to workers (DataFusion's own travel as `datafusion-proto` writes them).
//!
//! A scan travels as its table's definition, the scan spec in the form tablet servers read
//! (`ScanSpec::encode`), its tablets, snapshot and task split, and DataFusion's dynamic filters
//! (a hash join's, when the join runs in the scan's stage: decoded together, they share the
//! filter, which the join fills in before the scan starts); the worker rebuilds it over its
//! own engine client. The table's definition travels whole, so a worker whose view of the
//! catalog lags the coordinator's still scans the table the statement planned against.

use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf::PhysicalExprNode;
use nyala_engine::{Client, TableInfo};
use nyala_storage::{ScanSpec, Timestamp};
use prost::Message;
use serde::{Deserialize, Serialize};

use crate::exec::probe_slices::ProbeSlicesExec;
use crate::exec::scan::{NyalaScanExec, ScanParts, TaskSplit};
use crate::session::settings::RuntimeFilterMode;

/// Encodes and decodes Nyala's operators; decoded scans read through `client`.
#[derive(Debug, Clone)]
pub struct NyalaCodec {
    client: Client,
}

impl NyalaCodec {
    pub fn new(client: Client) -> Self {
        Self { client }
    }
}

/// One of Nyala's operators as it travels.
#[derive(Serialize, Deserialize)]
enum Node {
    Scan {
        table: TableInfo,
        /// `ScanSpec::encode`'s JSON.
        spec: String,
        string_views: bool,
        pushed: Vec<String>,
        tablets: Vec<usize>,
        snapshot: Option<u64>,
        as_of: bool,
        tasks: Option<(Vec<Vec<usize>>, Vec<String>)>,
        /// DataFusion's dynamic filters (as `datafusion-proto` writes expressions: a join
        /// decoded in the same stage shares them), and `nyala.runtime_filters`' mode.
        #[serde(default)]
        dynamic: Vec<Vec<u8>>,
        #[serde(default)]
        dynamic_mode: String,
    },
    ProbeSlices {
        rows: usize,
    },
}

fn external(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

impl PhysicalExtensionCodec for NyalaCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let node: Node = serde_json::from_slice(buf).map_err(external)?;
        match (node, inputs) {
            (
                Node::Scan {
                    table,
                    spec,
                    string_views,
                    pushed,
                    tablets,
                    snapshot,
                    as_of,
                    tasks,
                    dynamic,
                    dynamic_mode,
                },
                [],
            ) => {
                let mut spec = ScanSpec::decode(spec.as_bytes()).map_err(external)?;
                spec.string_views = string_views;
                let parts = ScanParts {
                    spec,
                    pushed,
                    tablets,
                    snapshot: snapshot.map(Timestamp),
                    as_of,
                    tasks: tasks.map(|(tablets, servers)| TaskSplit { tablets, servers }),
                };
                let scan = NyalaScanExec::from_parts(self.client.clone(), Arc::new(table), parts)?;
                let context = PhysicalPlanDecodeContext::new(ctx, self);
                let dynamic = (dynamic.iter())
                    .map(|bytes| {
                        let node = PhysicalExprNode::decode(bytes.as_slice()).map_err(external)?;
                        proto_converter.proto_to_physical_expr(&node, &scan.schema(), &context)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let mode =
                    RuntimeFilterMode::parse(&dynamic_mode).unwrap_or(RuntimeFilterMode::Off);
                Ok(Arc::new(scan.with_dynamic_filters(dynamic, mode)))
            }
            (Node::ProbeSlices { rows }, [input]) => {
                Ok(Arc::new(ProbeSlicesExec::new(input.clone(), rows)))
            }
            _ => Err(DataFusionError::Internal(
                "a Nyala operator arrived with the wrong number of inputs".into(),
            )),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let encoded = if let Some(scan) = node.downcast_ref::<NyalaScanExec>() {
            let parts = scan.parts();
            let spec = parts.spec.encode().map_err(external)?;
            let dynamic = (scan.dynamic_filters().iter())
                .map(|expr| {
                    Ok(proto_converter
                        .physical_expr_to_proto(expr, self)?
                        .encode_to_vec())
                })
                .collect::<Result<Vec<_>>>()?;
            Node::Scan {
                table: scan.table().as_ref().clone(),
                spec: String::from_utf8(spec).map_err(external)?,
                string_views: parts.spec.string_views,
                pushed: parts.pushed,
                tablets: parts.tablets,
                snapshot: parts.snapshot.map(|s| s.0),
                as_of: parts.as_of,
                tasks: parts.tasks.map(|t| (t.tablets, t.servers)),
                dynamic,
                dynamic_mode: format!("{:?}", scan.dynamic_mode()),
            }
        } else if let Some(slices) = node.downcast_ref::<ProbeSlicesExec>() {
            Node::ProbeSlices {
                rows: slices.rows(),
            }
        } else {
            return Err(DataFusionError::NotImplemented(format!(
                "{} cannot run on another server",
                node.name()
            )));
        };
        serde_json::to_writer(buf, &encoded).map_err(external)
    }
}
