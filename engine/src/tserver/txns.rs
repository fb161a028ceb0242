//! Ending abandoned transactions: a transaction whose coordinator went away (a crash, a lost
//! connection) would keep its keys locked and, once prepared, hold back the snapshots of its
//! tablets. The leader of each tablet ends such a transaction as its status row decides, or,
//! if nothing was decided, by recording an abort there first (see
//! [`crate::Client::resolve_txn`]).

use std::future::Future;
use std::sync::Weak;
use std::time::Duration;

use nyala_storage::Timestamp;

use super::TabletServer;
use crate::Client;

/// How long a transaction may go without a write in a tablet, and how long it may stay
/// prepared, before the tablet takes it for abandoned.
const ABANDONED_AFTER_WRITE: Duration = Duration::from_secs(60);
const ABANDONED_AFTER_PREPARE: Duration = Duration::from_secs(5);

/// Every second, ends the abandoned transactions of the tablets `server` leads, for as long as
/// the server is open. `client` gives a client of the cluster (None: not now).
pub async fn resolve_abandoned<F, Fut>(server: Weak<TabletServer>, client: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<Client>>,
{
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let Some(server) = server.upgrade() else {
            return;
        };
        let abandoned = server.abandoned_txns();
        if abandoned.is_empty() {
            continue;
        }
        let Some(client) = client().await else {
            continue;
        };
        for (tablet, txn) in abandoned {
            match client.resolve_txn(&tablet, txn).await {
                Ok(committed) => {
                    tracing::info!(tablet, txn, committed, "ended an abandoned transaction")
                }
                Err(e) => {
                    tracing::warn!(tablet, txn, error = %e, "cannot end an abandoned transaction")
                }
            }
        }
    }
}

impl TabletServer {
    /// The (tablet, transaction) pairs abandoned in the tablets this server leads.
    fn abandoned_txns(&self) -> Vec<(String, u64)> {
        let now = self.clock.now().micros();
        let age = |ts: Timestamp| Duration::from_micros(now.saturating_sub(ts.micros()));
        let mut abandoned = Vec::new();
        for tablet in self.tablet_ids() {
            let Ok(replica) = self.replica(&tablet) else {
                continue;
            };
            if !replica.is_leader() {
                continue;
            }
            for txn in replica.pending_txns() {
                let stale = match txn.prepared {
                    Some(p) => age(p) > ABANDONED_AFTER_PREPARE,
                    None => age(txn.last_write) > ABANDONED_AFTER_WRITE,
                };
                if stale {
                    abandoned.push((tablet.clone(), txn.txn));
                }
            }
        }
        abandoned
    }
}
