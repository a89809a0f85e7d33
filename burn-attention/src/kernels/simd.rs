//! Row kernels, compiled for AVX-512 and AVX2 beside the portable build and picked at run time.

use super::hash::column_hash;

/// Lanes the loops are written over; the compiler maps them onto vector registers.
const LANES: usize = 16;

/// `exp(x)` for `f32`, to about 2 ulp: `2^n · p(r)` with `x = n ln 2 + r`, `|r| <= ln2/2`,
/// `p` the degree-6 Taylor polynomial. Inputs below -87.3 give 0, above 88.7 a large finite
/// value; attention only feeds it scores minus their row maximum. The 0 matters for speed, not
/// only accuracy: masked scores land far below -87.3, and a weight of 1e-38 (the smallest
/// normal `f32`) multiplied by a gradient is subnormal, which x86 cores compute in microcode
/// assists tens of times slower than normal arithmetic; padded batches trained 3-4x slower.
#[inline(always)]
fn exp(x: f32) -> f32 {
    /// Below this `exp` is subnormal or 0 in `f32`: the result is 0.
    const UNDERFLOW: f32 = -87.3;
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 · 2^23: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let tiny = x < UNDERFLOW;
    let x = x.clamp(UNDERFLOW, 88.7);
    let shifted = x * LOG2E + ROUND;
    let n = shifted - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // `2^n` from the bits: `shifted` lies in [2^23, 2^24), where the step between floats is 1,
    // so its bit pattern is ROUND's plus the integer `n` (-126 to 128). An integer subtraction
    // reads `n` where `n as i32`, saturating, compiles to one scalar conversion per lane.
    let n_int = shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let y = f32::from_bits((n_int.wrapping_add(127) as u32) << 23) * p;
    if tiny { 0.0 } else { y }
}

/// `softplus(x) = ln(1 + eˣ)` for `f32`, without overflow: `max(x, 0) + ln(1 + e)` with
/// `e = exp(−|x|)` in (0, 1], and `ln(1 + e) = 2 atanh(s) = 2 (s + s³/3 + … + s¹³/13)` for
/// `s = e / (2 + e)` in (0, 1/3] (the series' remainder below 1e-8 of the sum; `s` is formed
/// from `e`, not from `1 + e`, so a tiny `e` keeps its digits).
#[inline(always)]
fn softplus_of(x: f32) -> f32 {
    let e = exp(-x.abs());
    let s = e / (2.0 + e);
    let s2 = s * s;
    let series = 1.0
        + s2 * (1.0 / 3.0
            + s2 * (1.0 / 5.0
                + s2 * (1.0 / 7.0 + s2 * (1.0 / 9.0 + s2 * (1.0 / 11.0 + s2 * (1.0 / 13.0))))));
    x.max(0.0) + 2.0 * s * series
}

/// `erfc(x)` for `f32`: the Chebyshev fit of Numerical Recipes (Press et al., 2nd ed.,
/// §6.2, `erfcc`: fractional error below 1.2e-7 in exact arithmetic),
/// `t exp(−z² + P(t))` with `z = |x|`, `t = 1 / (1 + z/2)`, and `2 − erfc(−x)` for `x < 0`.
/// Relative error in `f32` about 1e-6 (the rounding of `z²` inside the exponential).
#[inline(always)]
fn erfc(x: f32) -> f32 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_204
                                + t * (1.488_515_9 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * exp(-z * z + p);
    if x >= 0.0 { r } else { 2.0 - r }
}

/// `1/√2`.
const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// `1/√(2π)`.
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

macro_rules! kernels {
    ($($(#[$attr:meta])* $vis:vis unsafe fn $name:ident $args:tt -> $ret:ty $body:block)*) => {
        /// The portable build of every kernel.
        mod portable {
            #[allow(unused_imports)]
            use super::*;
            $(#[inline(always)] pub fn $name $args -> $ret $body)*
        }
        #[cfg(target_arch = "x86_64")]
        mod avx512 {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                pub unsafe fn $name $args -> $ret $body
            )*
        }
        #[cfg(target_arch = "x86_64")]
        mod avx2 {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[target_feature(enable = "avx2,fma")]
                pub unsafe fn $name $args -> $ret $body
            )*
        }
    };
}

kernels! {
    unsafe fn max_impl(row: &[f32]) -> f32 {
        let mut acc = [f32::NEG_INFINITY; LANES];
        let mut chunks = row.chunks_exact(LANES);
        for chunk in &mut chunks {
            for (a, &x) in acc.iter_mut().zip(chunk) {
                *a = if x > *a { x } else { *a };
            }
        }
        let mut best = chunks.remainder().iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
        for a in acc {
            best = best.max(a);
        }
        best
    }

    unsafe fn exp_shift_sum_impl(row: &mut [f32], shift: f32) -> f32 {
        let mut acc = [0.0f32; LANES];
        let mut chunks = row.chunks_exact_mut(LANES);
        for chunk in &mut chunks {
            for (a, x) in acc.iter_mut().zip(chunk) {
                *x = exp(*x - shift);
                *a += *x;
            }
        }
        let mut sum = 0.0;
        for x in chunks.into_remainder() {
            *x = exp(*x - shift);
            sum += *x;
        }
        sum + acc.iter().sum::<f32>()
    }

    unsafe fn exp_shift_impl(row: &mut [f32], shift: f32) -> () {
        for x in row {
            *x = exp(*x - shift);
        }
    }

    unsafe fn softmax_grad_impl(dp: &mut [f32], p: &[f32], delta: f32, scale: f32) -> () {
        for (g, &p) in dp.iter_mut().zip(p) {
            *g = p * (*g - delta) * scale;
        }
    }

    unsafe fn dropout_row_impl(values: &mut [f32], key: [u32; 2], col0: u32, threshold: u32, scale: f32) -> () {
        let mut col = col0;
        for x in values.iter_mut() {
            let keep = column_hash(col, key) >= threshold;
            *x = if keep { *x * scale } else { 0.0 };
            col = col.wrapping_add(1);
        }
    }

    unsafe fn gelu_impl(values: &mut [f32]) -> () {
        for x in values.iter_mut() {
            *x = 0.5 * *x * erfc(-*x * FRAC_1_SQRT_2);
        }
    }

    unsafe fn gelu_grad_impl(grad: &mut [f32], x: &[f32]) -> () {
        for (g, &x) in grad.iter_mut().zip(x) {
            let cdf = 0.5 * erfc(-x * FRAC_1_SQRT_2);
            let pdf = FRAC_1_SQRT_2PI * exp(-0.5 * x * x);
            *g *= cdf + x * pdf;
        }
    }

    unsafe fn sigmoid_impl(values: &mut [f32]) -> () {
        for x in values.iter_mut() {
            *x = 1.0 / (1.0 + exp(-*x));
        }
    }

    unsafe fn sigmoid_grad_impl(grad: &mut [f32], y: &[f32]) -> () {
        for (g, &y) in grad.iter_mut().zip(y) {
            *g *= y * (1.0 - y);
        }
    }

    unsafe fn silu_impl(values: &mut [f32]) -> () {
        for x in values.iter_mut() {
            *x /= 1.0 + exp(-*x);
        }
    }

    unsafe fn silu_grad_impl(grad: &mut [f32], x: &[f32]) -> () {
        for (g, &x) in grad.iter_mut().zip(x) {
            let s = 1.0 / (1.0 + exp(-x));
            *g *= s * (1.0 + x * (1.0 - s));
        }
    }

    unsafe fn softplus_impl(values: &mut [f32]) -> () {
        for x in values.iter_mut() {
            *x = softplus_of(*x);
        }
    }

    unsafe fn softplus_grad_impl(grad: &mut [f32], x: &[f32]) -> () {
        for (g, &x) in grad.iter_mut().zip(x) {
            *g /= 1.0 + exp(-x);
        }
    }

    unsafe fn elu_plus_one_impl(values: &mut [f32]) -> () {
        for x in values.iter_mut() {
            *x = if *x > 0.0 { *x + 1.0 } else { exp(*x) };
        }
    }

    unsafe fn elu_plus_one_grad_impl(grad: &mut [f32], y: &[f32]) -> () {
        for (g, &y) in grad.iter_mut().zip(y) {
            *g *= y.min(1.0);
        }
    }

    unsafe fn dot_impl(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = [0.0f32; LANES];
        let mut ca = a.chunks_exact(LANES);
        let mut cb = b.chunks_exact(LANES);
        for (x, y) in (&mut ca).zip(&mut cb) {
            for ((s, &x), &y) in acc.iter_mut().zip(x).zip(y) {
                *s += x * y;
            }
        }
        let rest: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
        rest + acc.iter().sum::<f32>()
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Level {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

fn level() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        static LEVEL: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
        *LEVEL.get_or_init(|| {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vl")
                && std::arch::is_x86_feature_detected!("fma")
            {
                Level::Avx512
            } else if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                Level::Avx2
            } else {
                Level::Portable
            }
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    Level::Portable
}

macro_rules! dispatch {
    ($name:ident => $impl_name:ident ($($arg:ident : $ty:ty),*) -> $ret:ty) => {
        pub(in crate::kernels) fn $name($($arg: $ty),*) -> $ret {
            match level() {
                // SAFETY: `level` checked that the CPU has the features each build enables.
                #[cfg(target_arch = "x86_64")]
                Level::Avx512 => unsafe { avx512::$impl_name($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                Level::Avx2 => unsafe { avx2::$impl_name($($arg),*) },
                Level::Portable => portable::$impl_name($($arg),*),
            }
        }
    };
}

dispatch!(max => max_impl(row: &[f32]) -> f32);
dispatch!(exp_shift_sum => exp_shift_sum_impl(row: &mut [f32], shift: f32) -> f32);
dispatch!(exp_shift => exp_shift_impl(row: &mut [f32], shift: f32) -> ());
dispatch!(softmax_grad => softmax_grad_impl(dp: &mut [f32], p: &[f32], delta: f32, scale: f32) -> ());
dispatch!(dot => dot_impl(a: &[f32], b: &[f32]) -> f32);
dispatch!(gelu => gelu_impl(values: &mut [f32]) -> ());
dispatch!(gelu_grad => gelu_grad_impl(grad: &mut [f32], x: &[f32]) -> ());
dispatch!(elu_plus_one => elu_plus_one_impl(values: &mut [f32]) -> ());
dispatch!(sigmoid => sigmoid_impl(values: &mut [f32]) -> ());
dispatch!(sigmoid_grad => sigmoid_grad_impl(grad: &mut [f32], y: &[f32]) -> ());
dispatch!(silu => silu_impl(values: &mut [f32]) -> ());
dispatch!(silu_grad => silu_grad_impl(grad: &mut [f32], x: &[f32]) -> ());
dispatch!(softplus => softplus_impl(values: &mut [f32]) -> ());
dispatch!(softplus_grad => softplus_grad_impl(grad: &mut [f32], x: &[f32]) -> ());
dispatch!(elu_plus_one_grad => elu_plus_one_grad_impl(grad: &mut [f32], y: &[f32]) -> ());
dispatch!(dropout_row => dropout_row_impl(values: &mut [f32], key: [u32; 2], col0: u32, threshold: u32, scale: f32) -> ());

#[cfg(test)]
mod tests {
    /// The polynomial against the standard library over the range attention uses.
    #[test]
    fn exp_matches_std() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let x = -87.0 + 97.0 * i as f32 / 200_000.0;
            let want = (x as f64).exp();
            let got = super::exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
    }

    /// The exponent read from the bits is the rounded `n` a float-to-int conversion gives: the
    /// same `f32` for every input from the underflow bound to 88.7 (every 61st bit pattern).
    #[test]
    fn exp_reads_the_exponent_as_a_conversion_does() {
        let converted = |x: f32| {
            let x = x.clamp(-87.3, 88.7);
            let n = (x * std::f32::consts::LOG2_E + 12_582_912.0) - 12_582_912.0;
            n as i32
        };
        let mut checked = 0;
        for bits in (0..u32::MAX).step_by(61) {
            let x = f32::from_bits(bits);
            if !(-87.3..=88.7).contains(&x) {
                continue;
            }
            let n = converted(x);
            let y = super::exp(x);
            let reference = {
                let r = x - n as f32 * 0.693_145_75 - n as f32 * 1.428_606_8e-6;
                let p = 1.0
                    + r * (1.0
                        + r * (0.5
                            + r * (1.0 / 6.0
                                + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
                f32::from_bits(((n + 127) as u32) << 23) * p
            };
            assert_eq!(y.to_bits(), reference.to_bits(), "exp({x})");
            checked += 1;
        }
        assert!(checked > 10_000_000, "{checked}");
    }

    /// Below the normal range the result is exactly 0 (a masked score, -inf included), never a
    /// tiny normal value that turns the products it enters subnormal.
    #[test]
    fn exp_underflows_to_zero() {
        for x in [-87.31f32, -90.0, -104.0, -1.0e4, f32::NEG_INFINITY] {
            assert_eq!(super::exp(x), 0.0, "exp({x})");
        }
        assert!(super::exp(-87.29) >= f32::MIN_POSITIVE);
        let mut row = [-1.0e4f32, 0.0, -1.0e4];
        super::exp_shift(&mut row, 0.0);
        assert_eq!(row, [0.0, 1.0, 0.0]);
    }
}
