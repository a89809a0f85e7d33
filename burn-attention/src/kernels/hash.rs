//! The hash behind the counter-based dropout mask, below both the mask and the vectorised
//! kernels that apply it.

/// The 32-bit hash of column `col` in the row whose key is `key`: an xor-shift-multiply
/// avalanche (the multipliers of Wellons' `lowbias32`), the key's second word mixed in after
/// the first multiplication so that rows whose first words lie close do not repeat each
/// other's stream. Integer operations only, so that a loop over columns vectorises.
#[inline(always)]
pub(crate) fn column_hash(col: u32, key: [u32; 2]) -> u32 {
    let mut x = col.wrapping_add(key[0]);
    x ^= x >> 16;
    x = x.wrapping_mul(0x7FEB_352D);
    x ^= key[1];
    x ^= x >> 15;
    x = x.wrapping_mul(0x846C_A68B);
    x ^ (x >> 16)
}
