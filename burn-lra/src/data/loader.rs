//! Batches built off the training thread: a worker pads the next batches while the model
//! trains on the current one, through a bounded channel (a few batches in flight, never a copy
//! of the dataset).

use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::Scope;

use super::{Dataset, HostBatch};
use crate::rng::Rng;

/// Batches waiting in the channel at most.
pub const IN_FLIGHT: usize = 4;

/// The order training examples are drawn in: the whole split reshuffled at each pass, batches
/// taken in turn, a pass's tail shorter than a batch skipped. A pure function of the seed, so a
/// resumed run replays it to where it stopped ([`BatchPlan::skip`]).
#[derive(Debug, Clone)]
pub struct BatchPlan {
    rng: Rng,
    order: Vec<usize>,
    cursor: usize,
    len: usize,
    batch_size: usize,
}

impl BatchPlan {
    /// The plan for `len` examples in batches of `batch_size` (at most `len`), seeded by `seed`.
    pub fn new(len: usize, batch_size: usize, seed: u64) -> Self {
        Self {
            rng: Rng::new(seed ^ 0x5EED_DA7A),
            order: Vec::new(),
            cursor: 0,
            len,
            batch_size: batch_size.min(len),
        }
    }

    /// The indices of the next batch.
    pub fn next_batch(&mut self) -> &[usize] {
        if self.cursor + self.batch_size > self.order.len() {
            self.order = (0..self.len).collect();
            self.rng.shuffle(&mut self.order);
            self.cursor = 0;
        }
        self.cursor += self.batch_size;
        &self.order[self.cursor - self.batch_size..self.cursor]
    }

    /// Skips `n` batches.
    pub fn skip(&mut self, n: usize) {
        for _ in 0..n {
            self.next_batch();
        }
    }
}

/// Spawns a worker in `scope` that sends the next `count` training batches of `data` drawn by
/// `plan`. The worker stops early when the receiver is dropped.
pub fn training_batches<'scope>(
    scope: &'scope Scope<'scope, '_>,
    data: &'scope Dataset,
    mut plan: BatchPlan,
    count: usize,
) -> Receiver<HostBatch> {
    let (tx, rx) = sync_channel(IN_FLIGHT);
    scope.spawn(move || {
        for _ in 0..count {
            let examples: Vec<_> = plan
                .next_batch()
                .iter()
                .map(|&i| &data.examples[i])
                .collect();
            if tx.send(HostBatch::new(&examples)).is_err() {
                return;
            }
        }
    });
    rx
}

/// Spawns a worker in `scope` that sends every example of `data` once, in batches of
/// `batch_size` grouped by length (less padding; the order does not change sums over the split).
pub fn evaluation_batches<'scope>(
    scope: &'scope Scope<'scope, '_>,
    data: &'scope Dataset,
    batch_size: usize,
) -> Receiver<HostBatch> {
    let (tx, rx) = sync_channel(IN_FLIGHT);
    scope.spawn(move || {
        let mut order: Vec<usize> = (0..data.len()).collect();
        order.sort_by_key(|&i| {
            let e = &data.examples[i];
            e.tokens.len().max(e.pair.as_ref().map_or(0, |p| p.len()))
        });
        for chunk in order.chunks(batch_size) {
            let examples: Vec<_> = chunk.iter().map(|&i| &data.examples[i]).collect();
            if tx.send(HostBatch::new(&examples)).is_err() {
                return;
            }
        }
    });
    rx
}
