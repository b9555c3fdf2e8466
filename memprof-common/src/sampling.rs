//! Sampling by bytes (`--sample-bytes`).

/// Entries of the `SAMPLE_DISTANCES` table: equal-probability slices of
/// the exponential distribution the sampler draws distances from.
pub const SAMPLE_QUANTILES: u32 = 1024;
