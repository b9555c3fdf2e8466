//! Sampling (`--sample-bytes N`): allocations are followed as a Poisson
//! process over the bytes allocated, with mean distance N between sample
//! points, as tcmalloc, jemalloc and Go's runtime do. An allocation of
//! `size` bytes is followed with probability `1 - exp(-size/N)`.
//!
//! Two halves: [`distances`] is what the kernel draws the distance to the
//! next sample point from (it has no floating point), and [`scale`] turns
//! what was followed back into unbiased estimates, per stack, the way
//! pprof does for Go's heap profiles: counts and bytes times
//! `1 / (1 - exp(-mean_size/N))`, `mean_size` the stack's mean
//! allocation size.
use memprof_common::SAMPLE_QUANTILES;

/// The kernel's `SAMPLE_DISTANCES`: the exponential distribution of mean
/// `mean` cut into [`SAMPLE_QUANTILES`] slices of equal probability, each
/// slice given by its own mean, so a uniformly drawn entry has mean `mean`
/// (up to rounding) and the shape of the exponential.
pub fn distances(mean: u64) -> Vec<u64> {
    let k = SAMPLE_QUANTILES as f64;
    // E[X; a <= X < b] for X ~ Exp(1) is (a+1)e^-a - (b+1)e^-b.
    let partial = |x: f64| {
        if x.is_infinite() {
            0.0
        } else {
            (x + 1.0) * (-x).exp()
        }
    };
    (0..SAMPLE_QUANTILES)
        .map(|i| {
            let a = -(1.0 - i as f64 / k).ln();
            let b = -(1.0 - (i + 1) as f64 / k).ln();
            let slice_mean = k * (partial(a) - partial(b));
            ((slice_mean * mean as f64).round() as u64).max(1)
        })
        .collect()
}

/// `count` allocations of `bytes` in all, followed with sampling of mean
/// `mean`: the estimated count and bytes of all the allocations they stand for.
pub fn scale(count: u64, bytes: u64, mean: u64) -> (u64, u64) {
    if mean == 0 || count == 0 {
        return (count, bytes);
    }
    let weight = weight(bytes as f64 / count as f64, mean);
    (
        (count as f64 * weight).round() as u64,
        (bytes as f64 * weight).round() as u64,
    )
}

/// How many allocations of `size` bytes one followed allocation stands for.
pub fn weight(size: f64, mean: u64) -> f64 {
    let p = -(-size / mean as f64).exp_m1(); // 1 - exp(-size/N), precise for small sizes
    if p > 0.0 {
        1.0 / p
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances_have_the_mean_and_the_shape_of_the_exponential() {
        let table = distances(4096);
        assert_eq!(table.len(), SAMPLE_QUANTILES as usize);
        let mean = table.iter().sum::<u64>() as f64 / table.len() as f64;
        assert!((mean - 4096.0).abs() < 4096.0 * 0.001, "{mean}");
        assert!(table.windows(2).all(|w| w[0] <= w[1]), "sorted");
        // Median of Exp(mean): mean * ln 2.
        let median = table[table.len() / 2] as f64;
        assert!((median - 4096.0 * 2f64.ln()).abs() < 20.0, "{median}");
        assert!(table[0] >= 1);
    }

    #[test]
    fn scaling_undoes_the_sampling_probability() {
        // 1000 blocks of 4096 bytes followed with N = 4096: each was
        // followed with probability 1 - 1/e.
        let (count, bytes) = scale(1000, 4096 * 1000, 4096);
        let expected = 1000.0 / (1.0 - (-1f64).exp());
        assert_eq!(count, expected.round() as u64);
        assert_eq!(bytes, (expected * 4096.0).round() as u64);
        // Without sampling, nothing changes.
        assert_eq!(scale(7, 70, 0), (7, 70));
        assert_eq!(scale(0, 0, 4096), (0, 0));
        // Huge blocks are always followed: weight 1.
        assert_eq!(scale(3, 3 << 30, 4096), (3, 3 << 30));
    }
}
