//! The examples' random numbers.

/// A small deterministic generator (xorshift64*): reproducible windows, samples and generated
/// text without a dependency.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// An index drawn from the distribution `probs` (summing to one).
    #[allow(dead_code)] // `imdb_learner` draws no samples.
    pub fn sample(&mut self, probs: &[f32]) -> u8 {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        let mut acc = 0.0;
        for (i, &p) in probs.iter().enumerate() {
            acc += p as f64;
            if u < acc {
                return i as u8;
            }
        }
        (probs.len() - 1) as u8
    }
}
