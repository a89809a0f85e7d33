//! Random features: stacked orthogonal blocks for FAVOR+ and random orthogonal matrices for the
//! orthogonally initialised kernels, drawn from a device's generator and orthogonalised in f64
//! on the host.

use burn::prelude::*;
use burn::tensor::Distribution;

/// `m` random features of width `d`: stacked orthogonal `d × d` blocks (modified Gram-Schmidt
/// of Gaussian blocks, in f64 on the host), rows rescaled to the norms of independent Gaussian
/// vectors (χ(d)). Random numbers come from `device`'s generator.
pub fn orthogonal_features(m: usize, d: usize, device: &Device) -> Tensor<2> {
    let blocks = m.div_ceil(d);
    let gauss = gaussian_host(blocks * d + m, d, device);
    let mut rows = orthonormal_rows(&gauss[..blocks * d * d], blocks, d);
    rows.truncate(m);
    let norms = &gauss[blocks * d * d..];
    let mut data = Vec::with_capacity(m * d);
    for (i, row) in rows.iter().enumerate() {
        let chi = norms[i * d..(i + 1) * d]
            .iter()
            .map(|a| a * a)
            .sum::<f64>()
            .sqrt();
        data.extend(row.iter().map(|a| (a * chi) as f32));
    }
    Tensor::from_data(TensorData::new(data, [m, d]), device)
}

/// A random `d × d` orthogonal matrix (Gram-Schmidt of a Gaussian matrix, in f64 on the host),
/// from `device`'s generator.
pub fn random_orthogonal(d: usize, device: &Device) -> Tensor<2> {
    let gauss = gaussian_host(d, d, device);
    let data: Vec<f32> = orthonormal_rows(&gauss, 1, d)
        .iter()
        .flatten()
        .map(|&a| a as f32)
        .collect();
    Tensor::from_data(TensorData::new(data, [d, d]), device)
}

/// `rows × d` standard Gaussian numbers from `device`'s generator, on the host in f64.
fn gaussian_host(rows: usize, d: usize, device: &Device) -> Vec<f64> {
    Tensor::<2>::random([rows, d], Distribution::Normal(0.0, 1.0), device)
        .into_data()
        .convert::<f64>()
        .try_to_vec::<f64>()
        .expect("f64 data")
}

/// Modified Gram-Schmidt of `blocks` consecutive `d × d` blocks of `gauss`, block by block.
fn orthonormal_rows(gauss: &[f64], blocks: usize, d: usize) -> Vec<Vec<f64>> {
    let mut rows: Vec<Vec<f64>> = Vec::with_capacity(blocks * d);
    for b in 0..blocks {
        let mut block: Vec<Vec<f64>> = Vec::with_capacity(d);
        for r in 0..d {
            let mut v: Vec<f64> = gauss[(b * d + r) * d..(b * d + r + 1) * d].to_vec();
            for u in &block {
                let dot: f64 = v.iter().zip(u).map(|(a, c)| a * c).sum();
                v.iter_mut().zip(u).for_each(|(a, c)| *a -= dot * c);
            }
            let norm = v.iter().map(|a| a * a).sum::<f64>().sqrt();
            v.iter_mut().for_each(|a| *a /= norm);
            block.push(v);
        }
        rows.extend(block);
    }
    rows
}
