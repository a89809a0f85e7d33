//! The states between chunks of a chunked recurrence, by a parallel prefix scan.
//!
//! The chunked causal forms ([`crate::engines::decay`] with gates per key channel,
//! [`crate::engines::delta`]) carry a state `S` (`[d_k, d_v]` per head) from one chunk to the next
//! through an affine map per chunk, `S ↦ A_i(S) + B_i`: `A_i` a decay per key channel (gated
//! linear attention) or a `d_k × d_k` matrix (the delta rule), `B_i` the chunk's write. Each
//! chunk needs the state before it.
//!
//! A loop over the chunks would read each chunk's map as a slice of the tensor of all maps,
//! and under autodiff the backward of a slice is a gradient the size of the whole tensor: over
//! `n / c` chunks, time quadratic in `n` (seen at 16K positions: forward + backward 30 times
//! the forward). [`states_before`] instead composes the maps as a tree (Blelloch's scan; the
//! maps compose associatively, `(A₂, B₂) ∘ (A₁, B₁) = (A₂ A₁, A₂(B₁) + B₂)`): the up-sweep pairs
//! neighbours level by level, halving the count; the down-sweep hands each level's states to
//! its children. `2 log₂(n / c)` levels, each a few batched products over the level's maps, so
//! time and memory `O((n / c) d_k (d_k + d_v))` in all, forward and backward.

use burn::prelude::*;

/// Per chunk, the map the state goes through: `[m, N, d_k, d_k]` matrices that left-multiply
/// it, or `[m, N, d_k, 1]` log-decays per key channel (`exp` of them scales its rows).
#[derive(Clone, Debug)]
pub(crate) enum ChunkMaps {
    /// `S ↦ exp(a) ⊙ S`, a log-decay per key channel: `[m, N, d_k, 1]`.
    LogDecays(Tensor<4>),
    /// `S ↦ A S`: `[m, N, d_k, d_k]`.
    Matrices(Tensor<4>),
}

impl ChunkMaps {
    /// The tensor either way.
    fn tensor(&self) -> &Tensor<4> {
        match self {
            Self::LogDecays(a) | Self::Matrices(a) => a,
        }
    }

    /// The same kind of map with `a` for its tensor.
    fn with(&self, a: Tensor<4>) -> Self {
        match self {
            Self::LogDecays(_) => Self::LogDecays(a),
            Self::Matrices(_) => Self::Matrices(a),
        }
    }

    /// `count` identity maps appended.
    fn padded(self, count: usize) -> Self {
        if count == 0 {
            return self;
        }
        let [m, _, rows, cols] = self.tensor().dims();
        let device = self.tensor().device();
        let identity = match &self {
            Self::LogDecays(_) => Tensor::zeros([m, count, rows, cols], &device),
            Self::Matrices(_) => Tensor::<2>::eye(rows, &device)
                .reshape([1, 1, rows, cols])
                .expand([m, count, rows, cols]),
        };
        let a = Tensor::cat(vec![self.tensor().clone(), identity], 1);
        self.with(a)
    }

    /// Each map applied to the state of the same position: `s: [m, N, d_k, d_v]`.
    fn apply(&self, s: Tensor<4>) -> Tensor<4> {
        match self {
            Self::LogDecays(a) => s * a.clone().exp(),
            Self::Matrices(a) => a.clone().matmul(s),
        }
    }

    /// `later ∘ self`, position by position: `self` first.
    fn then(self, later: &Self) -> Self {
        let a = match (&self, later) {
            (Self::LogDecays(first), Self::LogDecays(second)) => first.clone() + second.clone(),
            (Self::Matrices(first), Self::Matrices(second)) => second.clone().matmul(first.clone()),
            _ => unreachable!("maps of one kind compose"),
        };
        self.with(a)
    }

    /// The even and the odd positions.
    fn pairs(&self) -> (Self, Self) {
        let (even, odd) = pairs(self.tensor().clone());
        (self.with(even), self.with(odd))
    }
}

/// The even and the odd positions of `x: [m, N, r, c]` (`N` even), `[m, N / 2, r, c]` each.
fn pairs(x: Tensor<4>) -> (Tensor<4>, Tensor<4>) {
    let [m, n, r, c] = x.dims();
    let x = x.reshape([m, n / 2, 2, r * c]);
    let even = x.clone().slice(s![.., .., 0..1]).reshape([m, n / 2, r, c]);
    let odd = x.slice(s![.., .., 1..2]).reshape([m, n / 2, r, c]);
    (even, odd)
}

/// `even` and `odd` (`[m, H, r, c]` each) interleaved: `[m, 2H, r, c]`.
fn interleave(even: Tensor<4>, odd: Tensor<4>) -> Tensor<4> {
    let [m, h, r, c] = even.dims();
    Tensor::cat(
        vec![
            even.reshape([m, h, 1, r * c]),
            odd.reshape([m, h, 1, r * c]),
        ],
        2,
    )
    .reshape([m, 2 * h, r, c])
}

/// The state before each chunk (`[m, N, d_k, d_v]`) and after the last (`[m, d_k, d_v]`) of the
/// recurrence `S_i = A_i(S_{i−1}) + B_i` from `initial` (`[m, d_k, d_v]`), with `maps` the
/// `A_i` and `writes: [m, N, d_k, d_v]` the `B_i`: Blelloch's scan (see the module docs).
pub(crate) fn states_before(
    maps: ChunkMaps,
    writes: Tensor<4>,
    initial: Tensor<3>,
) -> (Tensor<4>, Tensor<3>) {
    let [m, chunks, d_k, d_v] = writes.dims();
    let device = writes.device();
    let size = chunks.next_power_of_two();
    let mut maps = maps.padded(size - chunks);
    let mut writes = if size == chunks {
        writes
    } else {
        let zeros = Tensor::zeros([m, size - chunks, d_k, d_v], &device);
        Tensor::cat(vec![writes, zeros], 1)
    };
    // Up-sweep: each level's pairs composed into the next; the first of each pair kept for the
    // down-sweep.
    let mut firsts = Vec::new();
    while writes.dims()[1] > 1 {
        let (maps_even, maps_odd) = maps.pairs();
        let (writes_even, writes_odd) = pairs(writes);
        writes = maps_odd.apply(writes_even.clone()) + writes_odd;
        maps = maps_even.clone().then(&maps_odd);
        firsts.push((maps_even, writes_even));
    }
    // The whole sequence's map, applied to the initial state: the state after the last chunk.
    let initial = initial.reshape([m, 1, d_k, d_v]);
    let last = (maps.apply(initial.clone()) + writes).reshape([m, d_k, d_v]);
    // Down-sweep: the state before a pair is the state before its first; the state before its
    // second, the first's map applied to it plus the first's write.
    let mut before = initial;
    for (maps_even, writes_even) in firsts.into_iter().rev() {
        let before_odd = maps_even.apply(before.clone()) + writes_even;
        before = interleave(before, before_odd);
    }
    let before = if size == chunks {
        before
    } else {
        before.slice(s![.., 0..chunks])
    };
    (before, last)
}
