//! Calls to one tablet server made at once travel in one `Batch` call, as Kudu's client
//! batches the operations bound for each server: a statement writes its tablets (and commits
//! its transaction in them) with concurrent calls, several of which usually go to the same
//! server. Each call is answered as if it had been made alone.
//!
//! How calls meet: the first call queued for a server yields once to the runtime before it
//! sends the queue, so the calls polled right after it (the other futures of the same join, or
//! of other tasks meanwhile) queue behind it and go in the same batch. A lone call goes as its
//! own RPC.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::rpc;
use crate::rpc::proto::tserver::batched_call::Call;
use crate::rpc::proto::tserver::{BatchedCall, CallBatch, WriteResponse};
use crate::{EngineError, Result};

type Answer = oneshot::Sender<Result<WriteResponse>>;

/// The calls waiting to go, by server address.
#[derive(Default, Clone)]
pub(super) struct Batches {
    queued: Arc<Mutex<HashMap<String, Vec<(Call, Answer)>>>>,
}

impl Batches {
    /// Makes `call` to the server at `address` over `channel`, in a batch with the calls made
    /// to it at the same time. A transport failure is [`EngineError::Unavailable`].
    pub(super) async fn call(
        &self,
        address: &str,
        channel: rpc::RpcChannel,
        call: Call,
    ) -> Result<WriteResponse> {
        let (answer, answered) = oneshot::channel();
        let first = {
            let mut queued = self.queued.lock();
            let queue = queued.entry(address.to_string()).or_default();
            queue.push((call, answer));
            queue.len() == 1
        };
        if first {
            let mut sender = Sender {
                batches: self.clone(),
                address: address.to_string(),
                channel: Some(channel),
            };
            tokio::task::yield_now().await;
            sender.send_now().await;
        }
        answered.await.unwrap_or_else(|_| {
            Err(EngineError::Unavailable(format!(
                "a call to {address} was dropped with the call that carried it"
            )))
        })
    }

    fn take(&self, address: &str) -> Vec<(Call, Answer)> {
        self.queued.lock().remove(address).unwrap_or_default()
    }
}

/// Sends a server's queue: when told to, or, if the call that was to send it is dropped
/// before, from a task of its own (the calls behind it must still go).
struct Sender {
    batches: Batches,
    address: String,
    channel: Option<rpc::RpcChannel>,
}

impl Sender {
    async fn send_now(&mut self) {
        if let Some(channel) = self.channel.take() {
            send(channel, self.batches.take(&self.address)).await;
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        if let Some(channel) = self.channel.take() {
            let calls = self.batches.take(&self.address);
            if !calls.is_empty() {
                tokio::spawn(send(channel, calls));
            }
        }
    }
}

/// Most bytes of requests one `Batch` call carries: a large statement's writes to a server
/// leading many of its tablets go in several calls, at once (each write is at most a few
/// MiB; a call at most [`rpc::MAX_MESSAGE_BYTES`]).
const MAX_BATCH_BYTES: usize = 32 << 20;

/// Sends `calls` over `channel` and hands each its answer: one alone as its own RPC, more in
/// `Batch` calls of at most [`MAX_BATCH_BYTES`] each.
async fn send(channel: rpc::RpcChannel, calls: Vec<(Call, Answer)>) {
    let sizes: Vec<usize> = (calls.iter()).map(|(call, _)| call.encoded_len()).collect();
    let mut calls = calls.into_iter();
    let groups = split_by_bytes(&sizes, MAX_BATCH_BYTES)
        .into_iter()
        .map(|n| calls.by_ref().take(n).collect::<Vec<_>>())
        .collect::<Vec<_>>();
    let sends = groups.into_iter().map(|group| {
        let channel = channel.clone();
        async move {
            match <[_; 1]>::try_from(group) {
                Ok([(call, answer)]) => send_one(channel, call, answer).await,
                Err(group) => send_batch(channel, group).await,
            }
        }
    });
    futures::future::join_all(sends).await;
}

/// How many of the calls of `sizes` (bytes each, in order) go in each call: consecutive
/// groups of at most `max` bytes, or of one call larger than that.
fn split_by_bytes(sizes: &[usize], max: usize) -> Vec<usize> {
    let mut groups = Vec::new();
    let (mut count, mut bytes) = (0, 0);
    for &size in sizes {
        if count > 0 && bytes + size > max {
            groups.push(count);
            (count, bytes) = (0, 0);
        }
        count += 1;
        bytes += size;
    }
    if count > 0 {
        groups.push(count);
    }
    groups
}

/// Makes `call` as its own RPC.
async fn send_one(channel: rpc::RpcChannel, call: Call, answer: Answer) {
    let mut client = rpc::tserver(channel);
    let answered = match call {
        Call::Write(request) => client.write(request).await,
        Call::TxnWrite(request) => client.txn_write(request).await,
        Call::TxnFinish(request) => client.txn_finish(request).await,
    };
    let _ = answer.send(
        answered
            .map(tonic::Response::into_inner)
            .map_err(rpc::from_status),
    );
}

/// Makes `calls` in one `Batch` call.
async fn send_batch(channel: rpc::RpcChannel, calls: Vec<(Call, Answer)>) {
    let (requests, answers): (Vec<Call>, Vec<Answer>) = calls.into_iter().unzip();
    let batch = CallBatch {
        calls: (requests.into_iter())
            .map(|call| BatchedCall { call: Some(call) })
            .collect(),
    };
    match rpc::tserver(channel).batch(batch).await {
        Ok(response) => {
            let mut answered = response.into_inner().answers.into_iter();
            for answer in answers {
                let result = match answered.next() {
                    Some(a) if a.code == 0 => a.response.ok_or_else(|| {
                        EngineError::Remote("a batched call answered without a response".into())
                    }),
                    Some(a) => Err(rpc::from_status(tonic::Status::with_details(
                        tonic::Code::from_i32(a.code),
                        a.message,
                        a.details,
                    ))),
                    None => Err(EngineError::Remote(
                        "a batch answered fewer calls than it carried".into(),
                    )),
                };
                let _ = answer.send(result);
            }
        }
        Err(status) => {
            for answer in answers {
                let _ = answer.send(Err(rpc::from_status(status.clone())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::split_by_bytes;

    #[test]
    fn calls_are_grouped_up_to_a_size() {
        assert_eq!(split_by_bytes(&[], 10), Vec::<usize>::new());
        assert_eq!(split_by_bytes(&[3, 3, 3, 3], 10), vec![3, 1]);
        assert_eq!(split_by_bytes(&[5, 5, 5], 10), vec![2, 1]);
        // A call larger than the bound goes alone.
        assert_eq!(split_by_bytes(&[2, 30, 2, 2], 10), vec![1, 1, 2]);
        assert_eq!(split_by_bytes(&[30], 10), vec![1]);
    }
}
