//! Sampling on the device: penalties over the request's history, logit
//! bias, temperature, top-k / top-p / min-p truncation and a seeded draw,
//! all as MLX ops on one row of logits; only the chosen token (and the
//! requested log-probabilities) come back to the host.

use super::batch::{ReturnOptions, SamplingParams};
use crate::ops::{random, where_};
use crate::{Array, Dtype, OpError};
use std::collections::BTreeMap;

/// The device-side result of sampling one row, read back after one eval.
pub struct Sampled {
    /// The sampled token id (uint32).
    pub token: Array,
    /// Its log-probability, when asked for.
    pub logprob: Option<Array>,
    /// The most likely token ids and their log-probabilities, when asked for.
    pub top: Option<(Array, Array)>,
    /// The row's float32 logits, when asked for.
    pub logits: Option<Array>,
}

fn host(e: crate::HostDataError) -> OpError {
    OpError::new("sampler", e.to_string())
}

fn neg_inf_like(x: &Array) -> Result<Array, OpError> {
    x.scalar_like(f64::NEG_INFINITY)
}

/// A key for step `step` of a request seeded with `seed` (splitmix64 mixing).
pub fn step_key(seed: u64, step: u64) -> Result<Array, OpError> {
    let mut z = seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    random::key(z ^ (z >> 31))
}

/// Apply penalties and bias to `logits [V]` (float32).
fn adjust(logits: &Array, params: &SamplingParams, history: &[u32]) -> Result<Array, OpError> {
    let mut x = logits.clone();
    if params.uses_history() && !history.is_empty() {
        let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
        for &t in history {
            *counts.entry(t).or_default() += 1;
        }
        let ids: Vec<u32> = counts.keys().copied().collect();
        let n = ids.len() as i32;
        let idx = Array::from_slice(&ids, &[n]).map_err(host)?;
        let mut seen = x.take(&idx, 0)?;
        if params.repetition_penalty != 1.0 {
            let p = seen.scalar_like(params.repetition_penalty as f64)?;
            let positive = seen.gt(&seen.scalar_like(0.0)?)?;
            seen = where_(&positive, &seen.div(&p)?, &seen.mul(&p)?)?;
        }
        if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
            let sub: Vec<f32> = counts
                .values()
                .map(|&c| params.presence_penalty + params.frequency_penalty * c as f32)
                .collect();
            seen = seen.sub(&Array::from_slice(&sub, &[n]).map_err(host)?)?;
        }
        x = x.put_along_axis(&idx, &seen, 0)?;
    }
    if !params.logit_bias.is_empty() {
        let ids: Vec<u32> = params.logit_bias.iter().map(|(t, _)| *t).collect();
        let bias: Vec<f32> = params.logit_bias.iter().map(|(_, b)| *b).collect();
        let n = ids.len() as i32;
        let idx = Array::from_slice(&ids, &[n]).map_err(host)?;
        let biased = x
            .take(&idx, 0)?
            .add(&Array::from_slice(&bias, &[n]).map_err(host)?)?;
        x = x.put_along_axis(&idx, &biased, 0)?;
    }
    Ok(x)
}

/// Mask everything outside the top-k / top-p / min-p set with -inf.
fn truncate(x: &Array, params: &SamplingParams) -> Result<Array, OpError> {
    let mut x = x.clone();
    let vocab = x.dim(-1)? as u32;
    if params.top_k > 0 && params.top_k < vocab {
        let kth = x.topk(params.top_k as i32, -1)?.min(&[-1], true)?;
        x = where_(&x.ge(&kth)?, &x, &neg_inf_like(&x)?)?;
    }
    if params.top_p < 1.0 {
        let probs = x.softmax(&[-1], true)?;
        let order = probs.neg()?.argsort(-1)?;
        let sorted = probs.take_along_axis(&order, -1)?;
        let before = sorted.cumsum(-1, false, false)?;
        let keep_sorted = before.lt(&before.scalar_like(params.top_p as f64)?)?;
        let keep =
            Array::zeros(&x.shape(), Dtype::Bool)?.put_along_axis(&order, &keep_sorted, -1)?;
        x = where_(&keep, &x, &neg_inf_like(&x)?)?;
    }
    if params.min_p > 0.0 {
        let probs = x.softmax(&[-1], true)?;
        let threshold = probs.max(&[-1], true)?.mul_scalar(params.min_p as f64)?;
        x = where_(&probs.ge(&threshold)?, &x, &neg_inf_like(&x)?)?;
    }
    Ok(x)
}

/// Sample one token from `logits [V]` (float32) with `params`; `key` is
/// used only when sampling is random (None there: MLX's global key).
pub fn sample(
    logits: &Array,
    params: &SamplingParams,
    history: &[u32],
    returns: &ReturnOptions,
    key: Option<&Array>,
) -> Result<Sampled, OpError> {
    let x = adjust(logits, params, history)?;
    let token = if params.temperature <= 0.0 {
        x.argmax(-1, false)?
    } else {
        let scaled = x.mul_scalar(1.0 / params.temperature as f64)?;
        let truncated = truncate(&scaled, params)?;
        random::categorical(&truncated, -1, key)?
    };
    let needs_logprobs = returns.logprob || returns.top_logprobs > 0;
    let logprobs = if needs_logprobs {
        Some(x.sub(&x.logsumexp(&[-1], true)?)?)
    } else {
        None
    };
    let logprob = match (&logprobs, returns.logprob) {
        (Some(lp), true) => Some(lp.take(&token.reshape(&[1])?, 0)?),
        _ => None,
    };
    let top = match &logprobs {
        Some(lp) if returns.top_logprobs > 0 => {
            let n = returns.top_logprobs.min(lp.size()) as i32;
            let ids = lp.neg()?.argpartition(n - 1, -1)?.slice_axis(-1, 0, n)?;
            Some((ids.clone(), lp.take(&ids, 0)?))
        }
        _ => None,
    };
    Ok(Sampled {
        token,
        logprob,
        top,
        logits: returns.logits.then(|| logits.clone()),
    })
}

/// The greedy token of each row of `logits [rows, vocab]` read back to the
/// host: the index of the row's largest value, the first one on ties, as
/// MLX's argmax picks it; a NaN counts as larger than any number (the first
/// NaN wins, as NumPy's argmax). MLX's CPU argmax walks a row one value
/// at a time (~0.35 ms for 8 rows of the default model's 49,152 logits).
/// Here two branch-free passes per row vectorise: the maximum (and whether
/// any value is NaN), then the first position holding it, 6–10 µs a row on
/// the Zen 3, where sixteen running maxima that also kept their positions
/// took ~110 µs (the position updates did not vectorise).
pub fn greedy_rows(logits: &[f32], vocab: usize) -> Vec<u32> {
    if vocab == 0 {
        return Vec::new();
    }
    logits
        .chunks_exact(vocab)
        .map(|row| greedy_index(row) as u32)
        .collect()
}

fn greedy_index(row: &[f32]) -> usize {
    const LANES: usize = 16;
    let (chunks, tail) = row.as_chunks::<LANES>();
    // Pass 1: the largest value and whether any value is NaN, per lane.
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut nan = [0u32; LANES];
    for chunk in chunks {
        for l in 0..LANES {
            let v = chunk[l];
            best[l] = if v > best[l] { v } else { best[l] };
            nan[l] |= u32::from(v.is_nan());
        }
    }
    let mut max = best
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    let mut any_nan = nan.iter().any(|&n| n != 0);
    for &v in tail {
        max = if v > max { v } else { max };
        any_nan |= v.is_nan();
    }
    if any_nan {
        return row.iter().position(|v| v.is_nan()).unwrap_or(0);
    }
    // Pass 2: the first position holding it (0 for a row of -inf).
    let first = |values: &[f32]| values.iter().position(|&v| v == max);
    for (c, chunk) in chunks.iter().enumerate() {
        if chunk.iter().fold(false, |hit, &v| hit | (v == max)) {
            return c * LANES + first(chunk).unwrap_or(0);
        }
    }
    first(tail).map_or(0, |i| chunks.len() * LANES + i)
}

#[cfg(test)]
mod tests {
    use super::greedy_rows;

    /// Values in (-amp, amp) from a xorshift stream.
    fn random(n: usize, amp: f32, state: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *state ^= *state << 13;
                *state ^= *state >> 7;
                *state ^= *state << 17;
                ((*state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
            })
            .collect()
    }

    /// The first index of the largest value (NaN first), one row at a time.
    fn reference(row: &[f32]) -> u32 {
        if let Some(i) = row.iter().position(|v| v.is_nan()) {
            return i as u32;
        }
        let mut best = 0;
        for (i, &v) in row.iter().enumerate() {
            if v > row[best] {
                best = i;
            }
        }
        best as u32
    }

    /// Random rows of every length around the lane count, ties planted
    /// across lanes and in the tail, -inf rows, NaNs.
    #[test]
    fn greedy_rows_pick_the_first_largest_value() {
        let mut state = 0x6e6e_1234_u64;
        for vocab in [1, 2, 15, 16, 17, 31, 33, 100, 49152, 49157] {
            let rows = 5;
            let mut logits = random(rows * vocab, 4.0, &mut state);
            let top = 100.0;
            // Row 1: one maximum twice (a later lane, then an earlier one).
            if vocab > 3 {
                logits[vocab + vocab - 1] = top;
                logits[vocab + 2] = top;
            }
            // Row 2: all -inf.
            logits[2 * vocab..3 * vocab].fill(f32::NEG_INFINITY);
            // Row 3: a NaN after the maximum.
            logits[3 * vocab] = top;
            logits[4 * vocab - 1] = f32::NAN;
            // Row 4: equal everywhere.
            logits[4 * vocab..].fill(0.5);
            let want: Vec<u32> = logits.chunks_exact(vocab).map(reference).collect();
            assert_eq!(greedy_rows(&logits, vocab), want, "vocab {vocab}");
            if vocab > 3 {
                assert_eq!(want[1], 2);
            }
            assert_eq!(want[3], vocab as u32 - 1);
        }
        assert!(greedy_rows(&[], 0).is_empty());
    }
}
