//! The promise, as an exact integer check: over every window `[t1, t2]` of
//! decision times, the tokens of kept admissions (admitted and never
//! refunded) are at most `capacity + (t2 - t1) / interval` (checked by
//! `tests/over_admission.rs` and `tests/exactness.rs`).

/// The worst excess over every window, in ns of refill time:
/// `max over t1 <= t2 of (kept tokens in [t1, t2] - capacity) * interval - (t2 - t1)`.
/// At most 0 when the promise holds; divide by `interval` for tokens.
/// `kept` holds `(now_ns, tokens)` of each kept admission, in any order.
pub fn worst_excess_ns(kept: &mut [(u64, u64)], capacity: u64, interval: u64) -> i128 {
    if kept.is_empty() {
        return -(capacity as i128 * interval as i128);
    }
    kept.sort_unstable();
    let t = interval as i128;
    // Window [t_i, t_j] over sorted admissions: tokens = S_j - S_{i-1}.
    // Excess = (S_j * T - t_j) + (t_i - S_{i-1} * T) - C * T; maximise the
    // second term over i <= j with a running maximum. Ties in time only make
    // a window that splits them smaller, so every i and j may be tried.
    let mut best = i128::MIN;
    let mut best_start = i128::MIN;
    let mut before: i128 = 0; // S_{i-1}
    for &(now, n) in kept.iter() {
        best_start = best_start.max(now as i128 - before * t);
        before += n as i128;
        best = best.max(before * t - now as i128 + best_start);
    }
    best - capacity as i128 * t
}

/// The same by brute force over every pair, to test the check itself.
pub fn worst_excess_ns_brute(kept: &[(u64, u64)], capacity: u64, interval: u64) -> i128 {
    let mut best = -(capacity as i128 * interval as i128);
    for &(a, _) in kept {
        for &(b, _) in kept {
            if a > b {
                continue;
            }
            let tokens: i128 = kept
                .iter()
                .filter(|&&(t, _)| a <= t && t <= b)
                .map(|&(_, n)| n as i128)
                .sum();
            best = best.max((tokens - capacity as i128) * interval as i128 - (b - a) as i128);
        }
    }
    best
}

/// The promise under quotas that differ from call to call: over every window
/// `[t1, t2]` of decision times, the kept admissions read in it cost at most
/// `(t2 - t1) +` the largest horizon among their quotas, each token costing
/// its own quota's interval. Returns the worst excess in ns (at most 0 when
/// the promise holds). `kept` holds `(now_ns, cost_ns, horizon_ns)` of each
/// kept admission (`cost = tokens x interval`, `horizon = capacity x
/// interval` of the quota it was decided with), in any order. By brute force
/// over every pair of readings: with one quota it is
/// [`worst_excess_ns_brute`].
pub fn worst_excess_mixed_ns(kept: &[(u64, u64, u64)]) -> i128 {
    let mut sorted = kept.to_vec();
    sorted.sort_unstable();
    let mut best = i128::MIN;
    for i in 0..sorted.len() {
        let t1 = sorted[i].0;
        // Every admission read at t1 belongs to each window that starts there.
        let first = sorted.partition_point(|&(t, _, _)| t < t1);
        if first != i {
            continue;
        }
        let mut cost: i128 = 0;
        let mut horizon: u64 = 0;
        let mut j = i;
        while j < sorted.len() {
            let t2 = sorted[j].0;
            while j < sorted.len() && sorted[j].0 == t2 {
                cost += sorted[j].1 as i128;
                horizon = horizon.max(sorted[j].2);
                j += 1;
            }
            best = best.max(cost - (t2 - t1) as i128 - horizon as i128);
        }
    }
    best
}
