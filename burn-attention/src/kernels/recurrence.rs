//! The linear recurrences of the decaying core (`retnet`, `mamba2`, `gla`) and the delta-rule
//! core (`deltanet`, `gated-deltanet`) on the CPU, forward and backward, token by token.
//!
//! Per sequence (one of batch × heads) the state `S` (`d_k × d_v`) follows
//! - the decaying rule, `S_t = Diag(α_t) S_{t−1} + k_t v_tᵀ`, `α_t = exp(g_t)` one per position
//!   (`g` of width 1) or per key channel (width `d_k`);
//! - the delta rule, `S_t = S'_t + k_t u_tᵀ` with `S'_t = α_t S_{t−1}`, `r_t = v_t − S'_tᵀ k_t`,
//!   `u_t = β_t r_t` (`α_t` one per position);
//!
//! and `o_t = S_tᵀ q_t`. On the CPU, with the head sizes the presets train (`d_k`, `d_v` of 16 to
//! 64), the recurrence is the cheapest exact form: `2 d_k d_v` multiply-adds a token forward
//! (`4` with the delta rule) against the chunked form's `c (d_k + d_v)` more for the weights
//! within a chunk, and the state stays in the first-level cache. The GPU's reason for chunks —
//! matrix units that want tiles — does not hold here.
//!
//! **Backward.** With `dS` the gradient of the loss with respect to `S_t` (from later positions
//! and from `o_t`), walked from the last position to the first:
//! - decaying: `dq_t = S_t do_t`, `dS += q_t do_tᵀ`, `dk_t = dS v_t`, `dv_t = dSᵀ k_t`,
//!   `dg_ta = α_ta Σ_b dS_ab S_{t−1,ab}` (summed over `a` with one decay a position), then
//!   `dS ← Diag(α_t) dS`;
//! - delta: `dq_t`, `dS` as above; `dk_t = dS u_t − α_t S_{t−1} dr_t`, `du_t = dSᵀ k_t`,
//!   `dβ_t = du_t·r_t`, `dr_t = dv_t = β_t du_t`; then `dS ← dS − k_t dr_tᵀ`,
//!   `dg_t = α_t ⟨dS, S_{t−1}⟩`, `dS ← α_t dS`.
//!
//! The backward needs `S_{t−1}` and `S_t` in reverse order: the forward keeps the state every
//! [`CHECKPOINT`] positions (`(n / 64) d_k d_v` a sequence, not `n d_k d_v`), and the backward
//! re-runs each stretch from its checkpoint into a buffer of `65 d_k d_v`. Time: the forward
//! twice and the backward's own `6 d_k d_v` (`9` with the delta rule) a token.
//!
//! Tensors are contiguous row-major `f32` slices over `m` = batch × heads sequences: `q`, `k`
//! `[m, n, d_k]`, `v` `[m, n, d_v]`, `g` `[m, n, w]`, `β` `[m, n]`. Work is spread over the
//! sequences with rayon; the loops are compiled for AVX2 beside the portable build and picked
//! at run time.

use rayon::prelude::*;

/// Positions between the states the forward pass keeps for the backward.
pub const CHECKPOINT: usize = 64;

/// Sizes of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecurrenceDims {
    /// Sequences (batch × heads).
    pub m: usize,
    /// Positions.
    pub n: usize,
    /// Key (and query) width: the state's rows.
    pub d_k: usize,
    /// Value width: the state's columns.
    pub d_v: usize,
    /// Log-decays a position: 1, or `d_k` (one per key channel, decaying rule only).
    pub decay_width: usize,
    /// Whether the recurrence runs from the last position to the first (`S_t` from `S_{t+1}`),
    /// the other half of the non-causal forms; each output stays at its own position.
    pub reverse: bool,
    /// Whether the output carries the final state after the outputs.
    pub with_state: bool,
}

impl RecurrenceDims {
    /// Checkpoints a sequence: one before every stretch of [`CHECKPOINT`] positions.
    fn checkpoints(&self) -> usize {
        self.n.div_ceil(CHECKPOINT)
    }

    /// The position taken at step `tau` of the walk.
    #[inline(always)]
    fn position(&self, tau: usize) -> usize {
        if self.reverse { self.n - 1 - tau } else { tau }
    }

    /// Values of the state.
    fn state(&self) -> usize {
        self.d_k * self.d_v
    }

    /// Rows a sequence of the joint output: `n` outputs, then the `d_k` rows of the final
    /// state when it is asked for.
    pub fn joint_rows(&self) -> usize {
        if self.with_state {
            self.n + self.d_k
        } else {
            self.n
        }
    }
}

/// The inputs of one call; `beta` present for the delta rule.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// Queries `[m, n, d_k]`.
    pub q: &'a [f32],
    /// Keys `[m, n, d_k]`.
    pub k: &'a [f32],
    /// Values `[m, n, d_v]`.
    pub v: &'a [f32],
    /// Log-decays `[m, n, w]`, each at most 0.
    pub g: &'a [f32],
    /// Writing strengths `[m, n]` (the delta rule), `None` for the decaying rule.
    pub beta: Option<&'a [f32]>,
}

/// One sequence's inputs.
#[derive(Clone, Copy)]
struct Sequence<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    beta: Option<&'a [f32]>,
}

impl<'a> Inputs<'a> {
    fn check(&self, dims: RecurrenceDims) {
        let RecurrenceDims {
            m,
            n,
            d_k,
            d_v,
            decay_width,
            ..
        } = dims;
        assert!(decay_width == 1 || decay_width == d_k);
        assert!(self.beta.is_none() || decay_width == 1);
        assert_eq!(self.q.len(), m * n * d_k);
        assert_eq!(self.k.len(), m * n * d_k);
        assert_eq!(self.v.len(), m * n * d_v);
        assert_eq!(self.g.len(), m * n * decay_width);
        if let Some(beta) = self.beta {
            assert_eq!(beta.len(), m * n);
        }
    }

    fn sequence(&self, i: usize, dims: RecurrenceDims) -> Sequence<'a> {
        let RecurrenceDims { n, d_k, d_v, .. } = dims;
        let w = dims.decay_width;
        Sequence {
            q: &self.q[i * n * d_k..(i + 1) * n * d_k],
            k: &self.k[i * n * d_k..(i + 1) * n * d_k],
            v: &self.v[i * n * d_v..(i + 1) * n * d_v],
            g: &self.g[i * n * w..(i + 1) * n * w],
            beta: self.beta.map(|b| &b[i * n..(i + 1) * n]),
        }
    }
}

/// What the forward pass returns: the joint output (`[m, n + d_k, d_v]`, each sequence's outputs
/// then its final state; `[m, n, d_v]` without the state) and, when asked for, the checkpoints
/// (`[m, ⌈n / 64⌉, d_k, d_v]`).
#[derive(Debug)]
pub struct Forward {
    /// Outputs and final states, `[m, n + d_k, d_v]` (`[m, n, d_v]` without the states).
    pub joint: Vec<f32>,
    /// The state before every stretch of [`CHECKPOINT`] positions (empty unless kept).
    pub checkpoints: Vec<f32>,
}

/// The forward pass; `keep` keeps the checkpoints the backward needs.
pub fn forward(inputs: Inputs<'_>, dims: RecurrenceDims, keep: bool) -> Forward {
    inputs.check(dims);
    let per_joint = dims.joint_rows() * dims.d_v;
    let per_checkpoints = if keep {
        dims.checkpoints() * dims.state()
    } else {
        0
    };
    let mut joint = vec![0.0; dims.m * per_joint];
    let mut checkpoints = vec![0.0; dims.m * per_checkpoints];
    if dims.m == 0 || per_joint == 0 {
        return Forward { joint, checkpoints };
    }
    let mut tasks: Vec<(&mut [f32], &mut [f32])> = joint
        .chunks_mut(per_joint)
        .zip(
            checkpoints
                .chunks_mut(per_checkpoints.max(1))
                .chain(std::iter::repeat_with(|| &mut [][..])),
        )
        .collect();
    tasks.par_iter_mut().enumerate().for_each_init(
        || Scratch::new(dims),
        |scratch, (i, (joint, kept))| {
            let (out, state) = joint.split_at_mut(dims.n * dims.d_v);
            let kept = if keep { Some(&mut kept[..]) } else { None };
            forward_sequence(inputs.sequence(i, dims), dims, (out, state, kept), scratch);
        },
    );
    Forward { joint, checkpoints }
}

/// The gradients of the inputs: `dq`, `dk` `[m, n, d_k]`, `dv` `[m, n, d_v]`, `dg` `[m, n, w]`,
/// `dbeta` `[m, n]` (empty for the decaying rule).
#[derive(Debug)]
pub struct Gradients {
    /// Of the queries.
    pub dq: Vec<f32>,
    /// Of the keys.
    pub dk: Vec<f32>,
    /// Of the values.
    pub dv: Vec<f32>,
    /// Of the log-decays.
    pub dg: Vec<f32>,
    /// Of the writing strengths (delta rule).
    pub dbeta: Vec<f32>,
}

/// The backward pass from the forward's checkpoints and the gradient of its joint output
/// (`[m, n + d_k, d_v]`: of the outputs, then of the final state; `[m, n, d_v]` without it).
pub fn backward(
    inputs: Inputs<'_>,
    dims: RecurrenceDims,
    checkpoints: &[f32],
    d_joint: &[f32],
) -> Gradients {
    inputs.check(dims);
    let RecurrenceDims { m, n, d_k, d_v, .. } = dims;
    let w = dims.decay_width;
    assert_eq!(checkpoints.len(), m * dims.checkpoints() * dims.state());
    assert_eq!(d_joint.len(), m * dims.joint_rows() * d_v);
    let delta = inputs.beta.is_some();
    let mut grads = Gradients {
        dq: vec![0.0; m * n * d_k],
        dk: vec![0.0; m * n * d_k],
        dv: vec![0.0; m * n * d_v],
        dg: vec![0.0; m * n * w],
        dbeta: vec![0.0; if delta { m * n } else { 0 }],
    };
    if m == 0 || n == 0 {
        return grads;
    }
    let size = |per: usize| per.max(1);
    let Gradients {
        dq,
        dk,
        dv,
        dg,
        dbeta,
    } = &mut grads;
    let mut tasks: Vec<SequenceGrads<'_>> = dq
        .chunks_mut(size(n * d_k))
        .zip(dk.chunks_mut(size(n * d_k)))
        .zip(dv.chunks_mut(size(n * d_v)))
        .zip(dg.chunks_mut(size(n * w)))
        .zip(
            dbeta
                .chunks_mut(size(n))
                .chain(std::iter::repeat_with(|| &mut [][..])),
        )
        .map(|((((dq, dk), dv), dg), dbeta)| SequenceGrads {
            dq,
            dk,
            dv,
            dg,
            dbeta,
        })
        .collect();
    let per_checkpoints = dims.checkpoints() * dims.state();
    let per_joint = dims.joint_rows() * d_v;
    tasks.par_iter_mut().enumerate().for_each_init(
        || Scratch::new(dims),
        |scratch, (i, grads)| {
            let d_joint = &d_joint[i * per_joint..(i + 1) * per_joint];
            let (d_out, d_state) = d_joint.split_at(n * d_v);
            backward_sequence(
                inputs.sequence(i, dims),
                dims,
                &checkpoints[i * per_checkpoints..(i + 1) * per_checkpoints],
                (d_out, d_state),
                (grads, scratch),
            );
        },
    );
    grads
}

/// The buffers a sequence's passes work in, allocated once per rayon task and reused across
/// the sequences it takes.
struct Scratch {
    /// The decays of one position, one per key channel.
    alpha: Vec<f32>,
    /// The gradient of each key channel's decay at one position.
    d_alpha: Vec<f32>,
    /// The state of the forward pass when the output does not carry it.
    state: Vec<f32>,
    /// `du_t`, `dr_t` of the delta rule.
    du: Vec<f32>,
    dr: Vec<f32>,
    /// The gradient of the state on the backward walk.
    ds: Vec<f32>,
    /// The states of one stretch: `states[j]` before its position `j`, `states[j + 1]` after.
    states: Vec<f32>,
    /// With the delta rule, `r_t` of each position of the stretch (and of the forward step).
    rs: Vec<f32>,
}

impl Scratch {
    fn new(dims: RecurrenceDims) -> Self {
        let stretch = dims.n.min(CHECKPOINT);
        let size = dims.state();
        Self {
            alpha: vec![0.0; dims.d_k],
            d_alpha: vec![0.0; dims.d_k],
            state: vec![0.0; size],
            du: vec![0.0; dims.d_v],
            dr: vec![0.0; dims.d_v],
            ds: vec![0.0; size],
            states: vec![0.0; (stretch + 1) * size],
            rs: vec![0.0; stretch.max(1) * dims.d_v],
        }
    }
}

/// One sequence's gradients, written in place.
struct SequenceGrads<'a> {
    dq: &'a mut [f32],
    dk: &'a mut [f32],
    dv: &'a mut [f32],
    dg: &'a mut [f32],
    dbeta: &'a mut [f32],
}

/// Runs `$generic` compiled with AVX2 and FMA and its rows on [`avx2::Rows`] where the CPU has
/// them, else the portable build on [`PortableRows`].
macro_rules! per_level {
    ($(#[$attr:meta])* fn $name:ident => $generic:ident ($($arg:ident : $ty:ty),*)) => {
        $(#[$attr])*
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn with_avx2($($arg: $ty),*) {
                    $generic::<avx2::Rows>($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the CPU has the features the build enables.
                    return unsafe { with_avx2($($arg),*) };
                }
            }
            $generic::<PortableRows>($($arg),*)
        }
    };
}

per_level!(
    /// One sequence forward: outputs `[n, d_v]`, the final state, and the checkpoints if kept.
    fn forward_sequence => forward_sequence_generic(
        seq: Sequence<'_>,
        dims: RecurrenceDims,
        out_state_kept: (&mut [f32], &mut [f32], Option<&mut [f32]>),
        scratch: &mut Scratch
    )
);

per_level!(
    /// One sequence backward (see the module docs).
    fn backward_sequence => backward_sequence_generic(
        seq: Sequence<'_>,
        dims: RecurrenceDims,
        checkpoints: &[f32],
        upstream: (&[f32], &[f32]),
        grads_scratch: (&mut SequenceGrads<'_>, &mut Scratch)
    )
);

/// The backward's passes over one row of `dS` (see the module docs), each reading and writing
/// the row once with several dot products at a time: written with vector intrinsics for AVX2
/// ([`avx2::Rows`]), where the compiler leaves loops with several reductions scalar, and
/// portably ([`PortableRows`]).
trait RowKernels {
    /// The decaying rule at row `a`: `ds ← α_a (ds + q_a do)`, returns `[dq_a, dk_a,
    /// Σ_b dS_ab S_{t−1,ab}]` (with `dS` after adding `q_a do`, before the decay) and adds
    /// `k_a dS_a` into `dv`.
    fn decaying_row(
        ds: &mut [f32],
        now_prev: (&[f32], &[f32]),
        do_v_dv: (&[f32], &[f32], &mut [f32]),
        q_k_alpha: (f32, f32, f32),
    ) -> [f32; 3];

    /// The delta rule's first pass at row `a`: `ds ← ds + q_a do`, returns `[dq_a, dS_a·r]`
    /// and adds `k_a dS_a` into `du`.
    fn delta_row_first(
        ds: &mut [f32],
        now: &[f32],
        do_r_du: (&[f32], &[f32], &mut [f32]),
        q_k: (f32, f32),
    ) -> [f32; 2];

    /// The delta rule's second pass at row `a`: `ds ← α (ds − k_a dr)`, returns
    /// `[S_{t−1,a}·dr, (ds − k_a dr)·S_{t−1,a}]`.
    fn delta_row_second(ds: &mut [f32], prev: &[f32], dr: &[f32], k_alpha: (f32, f32)) -> [f32; 2];
}

/// The row kernels in portable Rust.
struct PortableRows;

impl RowKernels for PortableRows {
    #[inline(always)]
    fn decaying_row(
        ds: &mut [f32],
        (now, prev): (&[f32], &[f32]),
        (d_o, v, dv): (&[f32], &[f32], &mut [f32]),
        (qa, ka, alpha): (f32, f32, f32),
    ) -> [f32; 3] {
        let mut sums = [0.0; 3];
        for b in 0..ds.len() {
            sums[0] += now[b] * d_o[b];
            let x = ds[b] + qa * d_o[b];
            sums[1] += x * v[b];
            dv[b] += ka * x;
            sums[2] += x * prev[b];
            ds[b] = alpha * x;
        }
        sums
    }

    #[inline(always)]
    fn delta_row_first(
        ds: &mut [f32],
        now: &[f32],
        (d_o, r, du): (&[f32], &[f32], &mut [f32]),
        (qa, ka): (f32, f32),
    ) -> [f32; 2] {
        let mut sums = [0.0; 2];
        for b in 0..ds.len() {
            sums[0] += now[b] * d_o[b];
            let x = ds[b] + qa * d_o[b];
            sums[1] += x * r[b];
            du[b] += ka * x;
            ds[b] = x;
        }
        sums
    }

    #[inline(always)]
    fn delta_row_second(
        ds: &mut [f32],
        prev: &[f32],
        dr: &[f32],
        (ka, alpha): (f32, f32),
    ) -> [f32; 2] {
        let mut sums = [0.0; 2];
        for b in 0..ds.len() {
            sums[0] += prev[b] * dr[b];
            let x = ds[b] - ka * dr[b];
            sums[1] += x * prev[b];
            ds[b] = alpha * x;
        }
        sums
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The row kernels on AVX2 and FMA, eight lanes at a time, the rest of a row through the
    //! portable kernels. Called only from code compiled with those features, on a CPU that has
    //! them.

    use std::arch::x86_64::*;

    use super::{PortableRows, RowKernels};

    /// The row kernels with AVX2 intrinsics.
    pub(super) struct Rows;

    /// The sum of the eight lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn sum(x: __m256) -> f32 {
        let half = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
        let pair = _mm_add_ps(half, _mm_movehl_ps(half, half));
        _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)))
    }

    /// Eight values from `x[at..]` (`at + 8 <= x.len()`, checked by the callers' loops).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load(x: &[f32], at: usize) -> __m256 {
        debug_assert!(at + 8 <= x.len());
        // SAFETY: in bounds, as the callers' loops keep it.
        unsafe { _mm256_loadu_ps(x.as_ptr().add(at)) }
    }

    /// Eight values into `x[at..]`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store(x: &mut [f32], at: usize, value: __m256) {
        debug_assert!(at + 8 <= x.len());
        // SAFETY: in bounds, as the callers' loops keep it.
        unsafe { _mm256_storeu_ps(x.as_mut_ptr().add(at), value) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn decaying_row(
        ds: &mut [f32],
        (now, prev): (&[f32], &[f32]),
        (d_o, v, dv): (&[f32], &[f32], &mut [f32]),
        (qa, ka, alpha): (f32, f32, f32),
    ) -> [f32; 3] {
        let d = ds.len();
        assert!(now.len() >= d && prev.len() >= d && d_o.len() >= d);
        assert!(v.len() >= d && dv.len() >= d);
        let (q8, k8, a8) = (
            _mm256_set1_ps(qa),
            _mm256_set1_ps(ka),
            _mm256_set1_ps(alpha),
        );
        let (mut acc_q, mut acc_k, mut acc_a) = (
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
        );
        let full = d - d % 8;
        let mut at = 0;
        while at < full {
            // SAFETY: `at + 8 <= full <= d`, and every row is at least `d` long (asserted).
            unsafe {
                let o = load(d_o, at);
                acc_q = _mm256_fmadd_ps(load(now, at), o, acc_q);
                let x = _mm256_fmadd_ps(q8, o, load(ds, at));
                acc_k = _mm256_fmadd_ps(x, load(v, at), acc_k);
                store(dv, at, _mm256_fmadd_ps(k8, x, load(dv, at)));
                acc_a = _mm256_fmadd_ps(x, load(prev, at), acc_a);
                store(ds, at, _mm256_mul_ps(a8, x));
            }
            at += 8;
        }
        let tail = PortableRows::decaying_row(
            &mut ds[full..],
            (&now[full..], &prev[full..]),
            (&d_o[full..], &v[full..], &mut dv[full..]),
            (qa, ka, alpha),
        );
        [
            sum(acc_q) + tail[0],
            sum(acc_k) + tail[1],
            sum(acc_a) + tail[2],
        ]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn delta_row_first(
        ds: &mut [f32],
        now: &[f32],
        (d_o, r, du): (&[f32], &[f32], &mut [f32]),
        (qa, ka): (f32, f32),
    ) -> [f32; 2] {
        let d = ds.len();
        assert!(now.len() >= d && d_o.len() >= d && r.len() >= d && du.len() >= d);
        let (q8, k8) = (_mm256_set1_ps(qa), _mm256_set1_ps(ka));
        let (mut acc_q, mut acc_r) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let full = d - d % 8;
        let mut at = 0;
        while at < full {
            // SAFETY: `at + 8 <= full <= d`, and every row is at least `d` long (asserted).
            unsafe {
                let o = load(d_o, at);
                acc_q = _mm256_fmadd_ps(load(now, at), o, acc_q);
                let x = _mm256_fmadd_ps(q8, o, load(ds, at));
                acc_r = _mm256_fmadd_ps(x, load(r, at), acc_r);
                store(du, at, _mm256_fmadd_ps(k8, x, load(du, at)));
                store(ds, at, x);
            }
            at += 8;
        }
        let tail = PortableRows::delta_row_first(
            &mut ds[full..],
            &now[full..],
            (&d_o[full..], &r[full..], &mut du[full..]),
            (qa, ka),
        );
        [sum(acc_q) + tail[0], sum(acc_r) + tail[1]]
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn delta_row_second(
        ds: &mut [f32],
        prev: &[f32],
        dr: &[f32],
        (ka, alpha): (f32, f32),
    ) -> [f32; 2] {
        let d = ds.len();
        assert!(prev.len() >= d && dr.len() >= d);
        let (k8, a8) = (_mm256_set1_ps(ka), _mm256_set1_ps(alpha));
        let (mut acc_r, mut acc_a) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let full = d - d % 8;
        let mut at = 0;
        while at < full {
            // SAFETY: `at + 8 <= full <= d`, and every row is at least `d` long (asserted).
            unsafe {
                let (p, g) = (load(prev, at), load(dr, at));
                acc_r = _mm256_fmadd_ps(p, g, acc_r);
                let x = _mm256_fnmadd_ps(k8, g, load(ds, at));
                acc_a = _mm256_fmadd_ps(x, p, acc_a);
                store(ds, at, _mm256_mul_ps(a8, x));
            }
            at += 8;
        }
        let tail = PortableRows::delta_row_second(
            &mut ds[full..],
            &prev[full..],
            &dr[full..],
            (ka, alpha),
        );
        [sum(acc_r) + tail[0], sum(acc_a) + tail[1]]
    }

    impl RowKernels for Rows {
        #[inline(always)]
        fn decaying_row(
            ds: &mut [f32],
            now_prev: (&[f32], &[f32]),
            do_v_dv: (&[f32], &[f32], &mut [f32]),
            q_k_alpha: (f32, f32, f32),
        ) -> [f32; 3] {
            // SAFETY: only code compiled for AVX2 and FMA, run where the CPU has them, picks
            // these rows (`per_level!`).
            unsafe { decaying_row(ds, now_prev, do_v_dv, q_k_alpha) }
        }

        #[inline(always)]
        fn delta_row_first(
            ds: &mut [f32],
            now: &[f32],
            do_r_du: (&[f32], &[f32], &mut [f32]),
            q_k: (f32, f32),
        ) -> [f32; 2] {
            // SAFETY: as above.
            unsafe { delta_row_first(ds, now, do_r_du, q_k) }
        }

        #[inline(always)]
        fn delta_row_second(
            ds: &mut [f32],
            prev: &[f32],
            dr: &[f32],
            k_alpha: (f32, f32),
        ) -> [f32; 2] {
            // SAFETY: as above.
            unsafe { delta_row_second(ds, prev, dr, k_alpha) }
        }
    }
}

/// Lanes of the dot products' accumulators (the compiler maps them onto vector registers).
const LANES: usize = 8;

/// `Σ a_i b_i`, in [`LANES`] partial sums.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for ((s, &x), &y) in acc.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    let rest: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    rest + acc.iter().sum::<f32>()
}

/// The decays of position `t`: one per key channel (`alpha`, `d_k` values; all equal with one
/// decay a position).
#[inline(always)]
fn decays_at(g: &[f32], t: usize, w: usize, alpha: &mut [f32]) {
    if w == 1 {
        alpha.fill(g[t].exp());
    } else {
        for (a, &g) in alpha.iter_mut().zip(&g[t * w..(t + 1) * w]) {
            *a = g.exp();
        }
    }
}

/// One step of the recurrence from `state` (`S_{t−1}`, updated in place to `S_t`); the
/// output `S_tᵀ q_t` added into `out` (zeroed by the caller) when given; with the delta rule,
/// `r_t` written into `r`.
#[inline(always)]
fn step(
    seq: &Sequence<'_>,
    dims: RecurrenceDims,
    t: usize,
    state: &mut [f32],
    (alpha, r): (&mut [f32], &mut [f32]),
    out: Option<&mut [f32]>,
) {
    let RecurrenceDims { d_k, d_v, .. } = dims;
    let q = &seq.q[t * d_k..(t + 1) * d_k];
    let k = &seq.k[t * d_k..(t + 1) * d_k];
    let v = &seq.v[t * d_v..(t + 1) * d_v];
    decays_at(seq.g, t, dims.decay_width, alpha);
    // The decay (already applied with the delta rule, whose write reads the decayed state),
    // then the write `k_a v` (decaying) or `β k_a r` (delta) into each row `a`, then the output.
    let (write, strength, decay) = match seq.beta {
        None => (v, 1.0, true),
        Some(beta) => {
            r.copy_from_slice(v);
            for (a, row) in state.chunks_exact_mut(d_v).enumerate() {
                let (al, ka) = (alpha[a], k[a]);
                for (s, r) in row.iter_mut().zip(r.iter_mut()) {
                    *s *= al;
                    *r -= ka * *s;
                }
            }
            (&r[..], beta[t], false)
        }
    };
    if !decay {
        alpha.fill(1.0);
    }
    match out {
        Some(out) => {
            for (a, row) in state.chunks_exact_mut(d_v).enumerate() {
                let (al, ka, qa) = (alpha[a], strength * k[a], q[a]);
                for ((s, &x), o) in row.iter_mut().zip(write).zip(out.iter_mut()) {
                    *s = al * *s + ka * x;
                    *o += qa * *s;
                }
            }
        }
        None => {
            for (a, row) in state.chunks_exact_mut(d_v).enumerate() {
                let (al, ka) = (alpha[a], strength * k[a]);
                for (s, &x) in row.iter_mut().zip(write) {
                    *s = al * *s + ka * x;
                }
            }
        }
    }
}

#[inline(always)]
fn forward_sequence_generic<R: RowKernels>(
    seq: Sequence<'_>,
    dims: RecurrenceDims,
    (out, state, mut kept): (&mut [f32], &mut [f32], Option<&mut [f32]>),
    scratch: &mut Scratch,
) {
    let RecurrenceDims { n, d_v, .. } = dims;
    // The state in the output when it carries it, else in the scratch buffers.
    let state = if dims.with_state {
        state
    } else {
        &mut scratch.state[..]
    };
    let (alpha, r) = (&mut scratch.alpha, &mut scratch.rs[..d_v]);
    state.fill(0.0);
    for tau in 0..n {
        if tau % CHECKPOINT == 0
            && let Some(kept) = kept.as_deref_mut()
        {
            let at = tau / CHECKPOINT * dims.state();
            kept[at..at + dims.state()].copy_from_slice(state);
        }
        let t = dims.position(tau);
        step(
            &seq,
            dims,
            t,
            state,
            (&mut alpha[..], &mut r[..]),
            Some(&mut out[t * d_v..(t + 1) * d_v]),
        );
    }
}

#[inline(always)]
fn backward_sequence_generic<R: RowKernels>(
    seq: Sequence<'_>,
    dims: RecurrenceDims,
    checkpoints: &[f32],
    (d_out, d_state): (&[f32], &[f32]),
    (grads, scratch): (&mut SequenceGrads<'_>, &mut Scratch),
) {
    let RecurrenceDims { n, d_k, d_v, .. } = dims;
    let w = dims.decay_width;
    let size = dims.state();
    let Scratch {
        alpha,
        d_alpha,
        du,
        dr,
        ds,
        states,
        rs,
        ..
    } = scratch;
    // The gradient of the final state (none without it in the output).
    if dims.with_state {
        ds.copy_from_slice(d_state);
    } else {
        ds.fill(0.0);
    }
    for stretch in (0..dims.checkpoints()).rev() {
        let start = stretch * CHECKPOINT;
        let end = (start + CHECKPOINT).min(n);
        states[..size].copy_from_slice(&checkpoints[stretch * size..(stretch + 1) * size]);
        for tau in start..end {
            let j = tau - start;
            let (before, after) = states.split_at_mut((j + 1) * size);
            after[..size].copy_from_slice(&before[j * size..]);
            step(
                &seq,
                dims,
                dims.position(tau),
                &mut after[..size],
                (&mut alpha[..], &mut rs[j * d_v..(j + 1) * d_v]),
                None,
            );
        }
        for tau in (start..end).rev() {
            let j = tau - start;
            let t = dims.position(tau);
            let prev = &states[j * size..(j + 1) * size];
            let now = &states[(j + 1) * size..(j + 2) * size];
            let q = &seq.q[t * d_k..(t + 1) * d_k];
            let k = &seq.k[t * d_k..(t + 1) * d_k];
            let v = &seq.v[t * d_v..(t + 1) * d_v];
            let d_o = &d_out[t * d_v..(t + 1) * d_v];
            let dq = &mut grads.dq[t * d_k..(t + 1) * d_k];
            let dk = &mut grads.dk[t * d_k..(t + 1) * d_k];
            let dv = &mut grads.dv[t * d_v..(t + 1) * d_v];
            decays_at(seq.g, t, w, alpha);
            match seq.beta {
                None => {
                    for (a, ds) in ds.chunks_exact_mut(d_v).enumerate() {
                        let rows = (&now[a * d_v..(a + 1) * d_v], &prev[a * d_v..(a + 1) * d_v]);
                        let [q_grad, k_grad, alpha_grad] =
                            R::decaying_row(ds, rows, (d_o, v, &mut *dv), (q[a], k[a], alpha[a]));
                        dq[a] = q_grad;
                        dk[a] = k_grad;
                        d_alpha[a] = alpha_grad;
                    }
                    if w == 1 {
                        grads.dg[t] = alpha[0] * d_alpha.iter().sum::<f32>();
                    } else {
                        for a in 0..d_k {
                            grads.dg[t * w + a] = alpha[a] * d_alpha[a];
                        }
                    }
                }
                Some(beta) => {
                    let (b, al) = (beta[t], alpha[0]);
                    let r = &rs[j * d_v..(j + 1) * d_v];
                    du.fill(0.0);
                    for (a, ds) in ds.chunks_exact_mut(d_v).enumerate() {
                        let now = &now[a * d_v..(a + 1) * d_v];
                        let [q_grad, dot_r] =
                            R::delta_row_first(ds, now, (d_o, r, du), (q[a], k[a]));
                        dq[a] = q_grad;
                        // u = β r
                        dk[a] = b * dot_r;
                    }
                    grads.dbeta[t] = dot(du, r);
                    for (dr, &du) in dr.iter_mut().zip(du.iter()) {
                        *dr = b * du;
                    }
                    dv.copy_from_slice(dr);
                    let mut d_al = 0.0;
                    for (a, ds) in ds.chunks_exact_mut(d_v).enumerate() {
                        let prev = &prev[a * d_v..(a + 1) * d_v];
                        let [read, decayed] = R::delta_row_second(ds, prev, dr, (k[a], al));
                        dk[a] -= al * read;
                        d_al += decayed;
                    }
                    grads.dg[t] = al * d_al;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift), values in `[lo, hi)`.
    fn values(len: usize, seed: u64, (lo, hi): (f64, f64)) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (lo + (hi - lo) * ((x >> 11) as f64 / (1u64 << 53) as f64)) as f32
            })
            .collect()
    }

    /// The loss `Σ c ∘ joint` of the forward pass, in float64 from the recurrence as written in
    /// the module docs (no checkpoints, no stretches).
    fn loss64(inputs: &[Vec<f64>; 5], dims: RecurrenceDims, delta: bool, c: &[f32]) -> f64 {
        let RecurrenceDims { m, n, d_k, d_v, .. } = dims;
        let w = dims.decay_width;
        let [q, k, v, g, beta] = inputs;
        let mut loss = 0.0;
        let per_joint = dims.joint_rows() * d_v;
        for i in 0..m {
            let mut s = vec![0.0f64; d_k * d_v];
            let c = &c[i * per_joint..(i + 1) * per_joint];
            for tau in 0..n {
                let t = if dims.reverse { n - 1 - tau } else { tau };
                let at = |x: &Vec<f64>, width: usize, j: usize| x[(i * n + t) * width + j];
                for a in 0..d_k {
                    let alpha = at(g, w, if w == 1 { 0 } else { a }).exp();
                    for b in 0..d_v {
                        s[a * d_v + b] *= alpha;
                    }
                }
                if delta {
                    let mut u = vec![0.0; d_v];
                    for b in 0..d_v {
                        let read: f64 = (0..d_k).map(|a| at(k, d_k, a) * s[a * d_v + b]).sum();
                        u[b] = at(beta, 1, 0) * (at(v, d_v, b) - read);
                    }
                    for a in 0..d_k {
                        for b in 0..d_v {
                            s[a * d_v + b] += at(k, d_k, a) * u[b];
                        }
                    }
                } else {
                    for a in 0..d_k {
                        for b in 0..d_v {
                            s[a * d_v + b] += at(k, d_k, a) * at(v, d_v, b);
                        }
                    }
                }
                for b in 0..d_v {
                    let o: f64 = (0..d_k).map(|a| at(q, d_k, a) * s[a * d_v + b]).sum();
                    loss += c[t * d_v + b] as f64 * o;
                }
            }
            for (x, &c) in s.iter().zip(&c[n * d_v..]) {
                loss += c as f64 * x;
            }
        }
        loss
    }

    /// The AVX2 row kernels equal the portable ones (which the float64 test below reaches only
    /// on a CPU without AVX2), to round-off, on rows of 3, 8, 19 and 32 values.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_rows_equal_portable_rows() {
        if !(std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma"))
        {
            eprintln!("SKIPPED vector_rows_equal_portable_rows: this CPU has no AVX2 and FMA");
            return;
        }
        let close = |a: &[f32], b: &[f32]| {
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                    "{a:?} against {b:?}"
                );
            }
        };
        for d in [3, 8, 19, 32] {
            let row = |seed| values(d, seed, (-2.0, 2.0));
            let (now, prev, d_o, v) = (row(1), row(2), row(3), row(4));
            let (ds, dv) = (row(5), row(6));
            let scalars = (0.7, -1.3, 0.4);
            let mut ours = (ds.clone(), dv.clone());
            let mut theirs = (ds.clone(), dv.clone());
            let a = avx2::Rows::decaying_row(
                &mut ours.0,
                (&now, &prev),
                (&d_o, &v, &mut ours.1),
                scalars,
            );
            let b = PortableRows::decaying_row(
                &mut theirs.0,
                (&now, &prev),
                (&d_o, &v, &mut theirs.1),
                scalars,
            );
            close(&a, &b);
            close(&ours.0, &theirs.0);
            close(&ours.1, &theirs.1);
            let mut ours = (ds.clone(), dv.clone());
            let mut theirs = (ds.clone(), dv.clone());
            let a = avx2::Rows::delta_row_first(
                &mut ours.0,
                &now,
                (&d_o, &v, &mut ours.1),
                (0.7, -1.3),
            );
            let b = PortableRows::delta_row_first(
                &mut theirs.0,
                &now,
                (&d_o, &v, &mut theirs.1),
                (0.7, -1.3),
            );
            close(&a, &b);
            close(&ours.0, &theirs.0);
            close(&ours.1, &theirs.1);
            let (mut ours, mut theirs) = (ds.clone(), ds.clone());
            let a = avx2::Rows::delta_row_second(&mut ours, &prev, &d_o, (-1.3, 0.4));
            let b = PortableRows::delta_row_second(&mut theirs, &prev, &d_o, (-1.3, 0.4));
            close(&a, &b);
            close(&ours, &theirs);
        }
    }

    /// The kernel's outputs, final state and every input gradient against float64: the loss
    /// `Σ c ∘ joint` from the recurrence written out, its gradients by central differences in
    /// float64. Both rules, one decay a position and one per key channel, lengths across a
    /// checkpoint and not a multiple of it, decays from none to steep, run from either end;
    /// value widths below, at and past a multiple of the kernel's lanes.
    #[test]
    fn recurrence_matches_float64_values_and_gradients() {
        for (delta, decay_width, n, reverse, d_v) in [
            (false, 1, 70, false, 4),
            (false, 5, 67, false, 9),
            (false, 5, 67, true, 8),
            (true, 1, 70, false, 9),
            (true, 1, 70, true, 4),
            (true, 1, 3, false, 17),
            (false, 1, 1, true, 4),
        ] {
            let dims = RecurrenceDims {
                m: 2,
                n,
                d_k: 5,
                d_v,
                decay_width,
                reverse,
                // The state read by the loss in every other case.
                with_state: n % 2 == 0 || !reverse,
            };
            let RecurrenceDims { m, d_k, d_v, .. } = dims;
            let q = values(m * n * d_k, 1, (-1.0, 1.0));
            let mut k = values(m * n * d_k, 2, (-1.0, 1.0));
            if delta {
                // Unit-length keys, as the variants give the delta rule.
                for row in k.chunks_mut(d_k) {
                    let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
                    row.iter_mut().for_each(|x| *x /= norm);
                }
            }
            let v = values(m * n * d_v, 3, (-2.0, 2.0));
            let g = values(m * n * decay_width, 4, (-3.0, 0.0));
            let beta = values(m * n, 5, (0.0, 1.0));
            let c = values(m * dims.joint_rows() * d_v, 6, (-1.0, 1.0));
            let inputs = Inputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: delta.then_some(&beta[..]),
            };
            let fwd = forward(inputs, dims, true);
            let got_loss: f64 = fwd
                .joint
                .iter()
                .zip(&c)
                .map(|(&x, &c)| x as f64 * c as f64)
                .sum();
            let wide = |x: &[f32]| x.iter().map(|&x| x as f64).collect::<Vec<f64>>();
            let all = [wide(&q), wide(&k), wide(&v), wide(&g), wide(&beta)];
            let want = loss64(&all, dims, delta, &c);
            assert!(
                (got_loss - want).abs() <= 1e-5 * want.abs().max(1.0),
                "loss {got_loss} against {want}"
            );
            let grads = backward(inputs, dims, &fwd.checkpoints, &c);
            let mut named = vec![
                ("q", 0, grads.dq),
                ("k", 1, grads.dk),
                ("v", 2, grads.dv),
                ("g", 3, grads.dg),
            ];
            if delta {
                named.push(("beta", 4, grads.dbeta));
            }
            for (name, which, got) in named {
                for (i, &got) in got.iter().enumerate() {
                    let h = 1e-6;
                    let mut plus = all.clone();
                    plus[which][i] += h;
                    let mut minus = all.clone();
                    minus[which][i] -= h;
                    let want = (loss64(&plus, dims, delta, &c) - loss64(&minus, dims, delta, &c))
                        / (2.0 * h);
                    assert!(
                        (got as f64 - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "d{name}[{i}] (delta {delta}, width {decay_width}, n {n}, reverse \
                         {reverse}): {got} against {want}"
                    );
                }
            }
        }
    }
}
